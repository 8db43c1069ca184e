//! The ordered queue of [`PeerEvent`]s from the peer to the supernode.
//!
//! Processes emit output records and status events into one [`Reporter`]
//! while they run (from the wasm thread); the uploader takes them out in
//! batches, in order, and marks them delivered once the supernode accepted
//! them. `flush` (the guest's `flush` host call) blocks until every event
//! emitted so far has been delivered, with a bounded wait.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bsp_api::control::PeerEvent;
use tokio::sync::{Notify, watch};

/// Estimated bytes of undelivered events above which processes that write
/// output wait for the uploader (see [`Reporter::wait_for_room`]).
pub const MAX_QUEUED_BYTES: usize = 64 << 20;

/// How many progress events at the queue's tail a new one is coalesced with.
const PROGRESS_COALESCE_WINDOW: usize = 256;

/// A cloneable handle to the peer's outgoing event queue.
#[derive(Clone)]
pub struct Reporter {
    inner: Arc<Inner>,
}

impl Default for Reporter {
    fn default() -> Self {
        Reporter::with_limit(MAX_QUEUED_BYTES)
    }
}

struct Inner {
    state: Mutex<State>,
    delivered: Condvar,
    /// The `delivered` count, for async waiters.
    delivered_count: watch::Sender<u64>,
    ready: Notify,
    max_queued_bytes: usize,
}

#[derive(Default)]
struct State {
    queue: VecDeque<PeerEvent>,
    /// Estimated size of `queue`.
    queued_bytes: usize,
    /// Events ever emitted.
    emitted: u64,
    /// Events ever confirmed delivered (a prefix of the emitted ones).
    delivered: u64,
    /// The first this many queued events were handed to the uploader by
    /// the last `next_batch` and must not change any more.
    taken: usize,
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Reporter")
            .field("queued", &s.queue.len())
            .field("emitted", &s.emitted)
            .field("delivered", &s.delivered)
            .finish()
    }
}

impl Reporter {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty queue whose output writers wait once `max_queued_bytes`
    /// (estimated) are undelivered.
    pub fn with_limit(max_queued_bytes: usize) -> Self {
        Reporter {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                delivered: Condvar::new(),
                delivered_count: watch::Sender::new(0),
                ready: Notify::new(),
                max_queued_bytes,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the queue half-updated
        // (every critical section is a push, a drain or a counter update), so
        // a poisoned lock is still usable.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Events ever emitted: an event's mark; it is delivered once
    /// [`Reporter::delivered_count`] exceeds its position.
    pub fn emitted(&self) -> u64 {
        self.lock().emitted
    }

    /// Events ever confirmed delivered (a prefix of the emitted ones).
    pub fn delivered_count(&self) -> u64 {
        self.lock().delivered
    }

    /// Follows [`Reporter::delivered_count`].
    pub fn watch_delivered(&self) -> watch::Receiver<u64> {
        self.inner.delivered_count.subscribe()
    }

    /// Append an event to the queue. A [`PeerEvent::Progress`] replaces an
    /// undelivered one of the same process at the tail of the queue (among
    /// the progress events there), so fast supersteps do not flood the
    /// uploader; it does not count as emitted then.
    pub fn emit(&self, event: PeerEvent) {
        self.emit_marked(event);
    }

    /// [`Reporter::emit`] that returns the event's mark: it has reached the
    /// supernode once [`Reporter::delivered_count`] is at least the mark.
    /// (A coalesced progress event gets the mark of everything emitted so
    /// far.)
    pub fn emit_marked(&self, event: PeerEvent) -> u64 {
        let mut s = self.lock();
        if let PeerEvent::Progress { job, pid, .. } = &event {
            let taken = s.taken;
            let same = s
                .queue
                .iter_mut()
                .skip(taken)
                .rev()
                .take(PROGRESS_COALESCE_WINDOW)
                .take_while(|e| matches!(e, PeerEvent::Progress { .. }))
                .find(|e| matches!(e, PeerEvent::Progress { job: j, pid: p, .. } if j == job && p == pid));
            if let Some(slot) = same {
                *slot = event;
                return s.emitted;
            }
        }
        s.queued_bytes += estimated_size(&event);
        s.queue.push_back(event);
        s.emitted += 1;
        let mark = s.emitted;
        drop(s);
        self.inner.ready.notify_one();
        mark
    }

    /// Block the calling (non-async) thread until every event emitted before
    /// this call has been delivered, `timeout` has passed, or `cancel` is set.
    /// Returns whether everything was delivered.
    pub fn flush_blocking(&self, timeout: Duration, cancel: &AtomicBool) -> bool {
        let target = self.lock().emitted;
        self.wait_until(Instant::now() + timeout, cancel, |s| s.delivered >= target)
    }

    /// Block the calling (non-async) thread while more than the queue's limit
    /// is undelivered: back-pressure on processes that write output faster
    /// than it can be uploaded. Returns `false` if `deadline` passed or
    /// `cancel` was set first.
    pub fn wait_for_room(&self, deadline: Instant, cancel: &AtomicBool) -> bool {
        let limit = self.inner.max_queued_bytes;
        self.wait_until(deadline, cancel, |s| s.queued_bytes <= limit)
    }

    /// Block until `done` holds for the queue's state (woken by deliveries,
    /// and at least every 50 ms to notice `cancel`); `false` if `deadline`
    /// passed or `cancel` was set first.
    fn wait_until(
        &self,
        deadline: Instant,
        cancel: &AtomicBool,
        done: impl Fn(&State) -> bool,
    ) -> bool {
        let mut s = self.lock();
        loop {
            if done(&s) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline || cancel.load(Ordering::Relaxed) {
                return false;
            }
            let wait = (deadline - now).min(Duration::from_millis(50));
            s = match self.inner.delivered.wait_timeout(s, wait) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Wait until at least one event is queued, then take up to `max_events`
    /// events whose estimated JSON size stays under `max_bytes` (at least one
    /// event is always taken). The caller must call [`Reporter::delivered`]
    /// with the batch's length once the batch has been accepted, and must not
    /// take another batch before that.
    pub async fn next_batch(&self, max_events: usize, max_bytes: usize) -> Vec<PeerEvent> {
        self.next_batch_paced(max_events, max_bytes, None).await
    }

    /// [`Reporter::next_batch`] that holds back a batch of nothing but
    /// [`PeerEvent::Progress`] until `progress_not_before`: progress waits
    /// and coalesces (one event per process), so a job of sub-millisecond
    /// supersteps does not cost the supernode a request per superstep.
    /// Any other event (output, status, an exit) is taken at once, with the
    /// progress queued before it.
    pub async fn next_batch_paced(
        &self,
        max_events: usize,
        max_bytes: usize,
        progress_not_before: Option<Instant>,
    ) -> Vec<PeerEvent> {
        loop {
            // Register interest before checking, so a concurrent `emit` is not missed.
            let notified = self.inner.ready.notified();
            let mut hold_until = None;
            {
                let mut s = self.lock();
                if let Some(t) = progress_not_before
                    && !s.queue.is_empty()
                    && Instant::now() < t
                    && s.queue
                        .iter()
                        .all(|e| matches!(e, PeerEvent::Progress { .. }))
                {
                    hold_until = Some(t);
                } else if !s.queue.is_empty() {
                    let mut size = 0usize;
                    let mut n = 0usize;
                    for e in s.queue.iter().take(max_events.max(1)) {
                        let sz = estimated_size(e);
                        if n > 0 && size + sz > max_bytes {
                            break;
                        }
                        size += sz;
                        n += 1;
                    }
                    s.taken = n;
                    return s.queue.iter().take(n).cloned().collect();
                }
            }
            match hold_until {
                Some(t) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(t.into()) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Mark the first `n` queued events as delivered (they were the batch
    /// returned by [`Reporter::next_batch`]) and wake `flush` waiters.
    pub fn delivered(&self, n: usize) {
        let mut s = self.lock();
        let n = n.min(s.queue.len());
        let freed: usize = s.queue.drain(..n).map(|e| estimated_size(&e)).sum();
        s.queued_bytes = s.queued_bytes.saturating_sub(freed);
        s.taken = 0;
        s.delivered += n as u64;
        let count = s.delivered;
        drop(s);
        self.inner.delivered.notify_all();
        self.inner.delivered_count.send_replace(count);
    }

    /// Take every queued event at once and count it as delivered (for
    /// embedders that consume events in-process, and tests).
    pub fn drain(&self) -> Vec<PeerEvent> {
        let mut s = self.lock();
        let events: Vec<PeerEvent> = s.queue.drain(..).collect();
        s.queued_bytes = 0;
        s.taken = 0;
        s.delivered += events.len() as u64;
        let count = s.delivered;
        drop(s);
        self.inner.delivered.notify_all();
        self.inner.delivered_count.send_replace(count);
        events
    }

    /// Number of events not yet delivered.
    pub fn pending(&self) -> usize {
        self.lock().queue.len()
    }
}

/// A cheap upper estimate of an event's JSON size, for batching.
fn estimated_size(e: &PeerEvent) -> usize {
    const OVERHEAD: usize = 128;
    match e {
        PeerEvent::Output { data, .. } => OVERHEAD + data.len() * 6 / 5,
        PeerEvent::ProcessAborted { reason, .. } | PeerEvent::ProcessFailed { reason, .. } => {
            OVERHEAD + reason.len() * 6 / 5
        }
        PeerEvent::Status { text, .. } => OVERHEAD + text.len() * 6 / 5,
        PeerEvent::ProcessExited { .. }
        | PeerEvent::ProcessRestored { .. }
        | PeerEvent::ProcessHandedOver { .. }
        | PeerEvent::Progress { .. }
        | PeerEvent::PeerUnreachable { .. } => OVERHEAD,
        PeerEvent::Disagreement { groups, what, .. } => {
            OVERHEAD + what.len() + groups.iter().map(|g| g.len() * 8).sum::<usize>()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(i: usize) -> PeerEvent {
        PeerEvent::Status {
            job: 1,
            pid: None,
            text: format!("event {i}"),
        }
    }

    #[tokio::test]
    async fn batches_are_taken_in_order_and_flush_waits_for_delivery() {
        let r = Reporter::new();
        for i in 0..5 {
            r.emit(status(i));
        }
        let batch = r.next_batch(3, usize::MAX).await;
        assert_eq!(batch.len(), 3);
        assert!(matches!(&batch[0], PeerEvent::Status { text, .. } if text == "event 0"));
        let cancel = AtomicBool::new(false);
        assert!(!r.flush_blocking(Duration::from_millis(1), &cancel));
        r.delivered(3);
        let batch = r.next_batch(10, usize::MAX).await;
        assert_eq!(batch.len(), 2);
        assert!(matches!(&batch[0], PeerEvent::Status { text, .. } if text == "event 3"));

        // A flush on another thread returns once the rest is delivered.
        let r2 = r.clone();
        let waiter = std::thread::spawn(move || {
            r2.flush_blocking(Duration::from_secs(30), &AtomicBool::new(false))
        });
        r.delivered(2);
        assert!(waiter.join().unwrap());
        assert_eq!(r.pending(), 0);
    }

    #[tokio::test]
    async fn batches_respect_the_byte_budget_but_always_take_one() {
        let r = Reporter::new();
        for i in 0..4 {
            r.emit(status(i));
        }
        assert_eq!(r.next_batch(10, 1).await.len(), 1);
        assert_eq!(r.next_batch(10, 300).await.len(), 2);
    }

    #[test]
    fn writers_wait_for_room_once_the_queue_is_full() {
        let r = Reporter::with_limit(300);
        let cancel = AtomicBool::new(false);
        r.emit(status(0));
        r.emit(status(1));
        assert!(r.wait_for_room(Instant::now(), &cancel), "under the limit");
        r.emit(status(2));
        assert!(!r.wait_for_room(Instant::now() + Duration::from_millis(20), &cancel));
        r.delivered(2);
        assert!(r.wait_for_room(Instant::now(), &cancel));
        r.emit(status(3));
        r.emit(status(4));
        r.drain();
        assert!(r.wait_for_room(Instant::now(), &cancel));
    }

    #[test]
    fn flush_gives_up_when_cancelled() {
        let r = Reporter::new();
        r.emit(status(0));
        let cancel = AtomicBool::new(true);
        let started = Instant::now();
        assert!(!r.flush_blocking(Duration::from_secs(30), &cancel));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    fn progress(pid: u32, superstep: u32) -> PeerEvent {
        PeerEvent::Progress {
            job: 1,
            pid,
            superstep,
        }
    }

    #[tokio::test]
    async fn progress_alone_waits_for_its_time_and_other_events_go_at_once() {
        let r = Reporter::new();
        r.emit(progress(0, 1));
        r.emit(progress(1, 1));
        r.emit(progress(0, 2));
        // Nothing but progress, and its time has not come: held back.
        let later = Instant::now() + Duration::from_secs(3600);
        let held = tokio::time::timeout(
            Duration::from_millis(20),
            r.next_batch_paced(16, 1 << 20, Some(later)),
        )
        .await;
        assert!(held.is_err(), "a progress-only batch went early: {held:?}");
        // Progress coalesced meanwhile; any other event takes it along at once.
        r.emit(status(7));
        let batch = r.next_batch_paced(16, 1 << 20, Some(later)).await;
        let debug = |b: &[PeerEvent]| format!("{b:?}");
        assert_eq!(
            debug(&batch),
            debug(&[progress(0, 2), progress(1, 1), status(7)])
        );
        r.delivered(batch.len());
        // Once its time has come, progress alone goes too.
        r.emit(progress(0, 3));
        let past = Instant::now();
        let batch = r.next_batch_paced(16, 1 << 20, Some(past)).await;
        assert_eq!(debug(&batch), debug(&[progress(0, 3)]));
    }

    #[tokio::test]
    async fn progress_of_a_process_replaces_its_undelivered_progress_at_the_tail() {
        let r = Reporter::new();
        r.emit(progress(0, 1));
        r.emit(progress(1, 1));
        r.emit(progress(0, 2));
        r.emit(progress(1, 2));
        r.emit(progress(0, 3));
        assert_eq!(r.emitted(), 2, "replacements are not new events");
        r.emit(status(0));
        // Behind other events a progress event is queued anew: order of
        // output and progress is kept.
        r.emit(progress(0, 4));
        assert_eq!(r.emitted(), 4);
        let batch = r.next_batch(10, usize::MAX).await;
        let got: Vec<String> = batch
            .iter()
            .map(|e| match e {
                PeerEvent::Progress { pid, superstep, .. } => format!("p{pid}@{superstep}"),
                PeerEvent::Status { text, .. } => text.clone(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(got, ["p0@3", "p1@2", "event 0", "p0@4"]);
        // Events taken by the uploader are not changed any more: the new
        // value is queued behind them.
        r.emit(progress(0, 5));
        assert_eq!(r.emitted(), 5);
        r.delivered(batch.len());
        let rest = r.next_batch(10, usize::MAX).await;
        assert!(
            matches!(
                rest[..],
                [PeerEvent::Progress {
                    pid: 0,
                    superstep: 5,
                    ..
                }]
            ),
            "{rest:?}"
        );
    }
}
