//! Plain renewals go to the database together (group commit; issue 14,
//! `state/plain_renewal.rs`).
//!
//! A renewal joins the waiting batch; if no batch is running, its request
//! starts a task that runs batches until none waits: each takes what
//! arrived while the one before ran (at most [`MAX_BATCH`]). Under load a
//! batch holds many renewals and costs the database about what one did;
//! alone, a renewal waits for nothing. The task is spawned, so a request
//! that is cancelled (its client went away) strands no other.

use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::Supernode;
use crate::state::{Plain, PlainOutcome};

/// Most renewals one batch takes.
pub(crate) const MAX_BATCH: usize = 512;

/// A renewal waiting for its batch, and where its outcome goes.
struct Waiting {
    plain: Plain,
    reply: oneshot::Sender<PlainOutcome>,
}

/// The renewals waiting, and whether a task runs batches.
#[derive(Default)]
pub(crate) struct Batches(Mutex<Queue>);

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiting>,
    running: bool,
}

impl Batches {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next batch, or `None` (and no task runs) when none waits.
    fn next(&self) -> Option<Vec<Waiting>> {
        let mut q = self.lock();
        if q.waiting.is_empty() {
            q.running = false;
            return None;
        }
        let n = q.waiting.len().min(MAX_BATCH);
        Some(q.waiting.drain(..n).collect())
    }
}

/// Renews `plain` in the next batch: its outcome, `Ok(None)` when it must
/// be renewed the usual way (it does more than renew, or its batch
/// failed).
pub(crate) async fn renew(sn: &Supernode, plain: Plain) -> PlainOutcome {
    let (reply, outcome) = oneshot::channel();
    let start = {
        let mut q = sn.inner.renewals.lock();
        q.waiting.push(Waiting { plain, reply });
        !std::mem::replace(&mut q.running, true)
    };
    if start {
        tokio::spawn(run(sn.clone()));
    }
    // The task always answers, unless the supernode panicked.
    outcome.await.unwrap_or(Ok(None))
}

/// Lets another task run batches if this one panics.
struct Running<'a>(&'a Batches);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lock().running = false;
        }
    }
}

/// Runs batches until none waits.
async fn run(sn: Supernode) {
    let _running = Running(&sn.inner.renewals);
    while let Some(batch) = sn.inner.renewals.next() {
        let (plains, replies): (Vec<Plain>, Vec<_>) =
            batch.into_iter().map(|w| (w.plain, w.reply)).unzip();
        let n = plains.len();
        let outcomes = sn
            .with_core_plain(move |core, inner, fx| {
                Ok(core.renew_plain(inner, fx, &plains, crate::now_ms()))
            })
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "a batch of plain renewals failed");
                (0..n).map(|_| Ok(None)).collect()
            });
        for (reply, outcome) in replies.into_iter().zip(outcomes) {
            // Its request may have gone away.
            let _ = reply.send(outcome);
        }
    }
}
