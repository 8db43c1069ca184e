//! Several supernodes on one PostgreSQL database (issue 14; DESIGN.md,
//! "Several supernodes").
//!
//! Each supernode keeps state derived from the database in memory — the
//! DHHT and its allocators, the online peers' leases and command queues,
//! the accounts the token checks read — and changes the database only in
//! state transitions ([`Supernode::with_core`]). With several supernodes on
//! one database:
//!
//! - **One transition at a time, across supernodes.** A transition holds
//!   the session advisory lock [`WRITE_LOCK`] from start to end, as one
//!   supernode's transitions hold its core mutex: every decision (placement,
//!   restore, sweep) is made on the state the one before it left.
//!   Plain renewals hold it in shared mode instead and run side by side
//!   (`state/plain_renewal.rs`). A transition waits for the lock at most
//!   30 s (`lock_timeout`), and a panic releases it.
//! - **Read again what another wrote.** A transaction that wrote increments
//!   `bspweb_generation` in its own commit (`sql`'s PostgreSQL engine); a
//!   supernode whose next transition finds a generation it did not write
//!   first rebuilds what it derived
//!   ([`Core::resync`](crate::state::Core::resync)). Any supernode can
//!   rebuild any placement because the DHHT needs only the peers and their
//!   powers (§4.2.2).
//! - **Wake followers everywhere.** After a transition that wrote, the
//!   supernode sends `NOTIFY bspweb` with what changed ([`Wake`]: jobs
//!   whose event streams grew, changes of job lists, the scheduler); every
//!   other supernode LISTENs ([`listen_task`]), resyncs — which wakes the
//!   long polls of peers with new commands — and wakes its event streams
//!   and scheduler. After it (re)connects to listen it wakes everything, as
//!   it may have missed a notification, and every [`CHECK_EVERY`] it reads
//!   the generation anyway (a supernode killed between its commit and its
//!   NOTIFY tells nobody).
//! - **Background duties** (lease sweep, scheduler) run on every supernode,
//!   but under the lock and on the database's state, so each change they
//!   make happens once: the first sweep after a lease ran out declares the
//!   peer gone, the others find it gone already.
//! - The JWT secret is in the database (`bspweb_secrets`), so a token any
//!   supernode issued is good at every other.

use std::time::Duration;

use bsp_api::JobId;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::sql::{Connection, OptionalExtension, WRITE_LOCK};
use crate::state::Core;
use crate::{Effects, Error, Inner, Supernode};

/// The channel supernodes notify each other on.
pub(crate) const CHANNEL: &str = "bspweb";

/// How often a supernode reads what the others changed without being told.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Notifications that arrive within this long of the last one acted on are
/// acted on together: a burst of changes elsewhere (a mass login after a
/// restart) costs one rebuild per interval, not one per change.
const COALESCE: Duration = Duration::from_millis(50);

/// Largest payload PostgreSQL takes (8000 bytes), with a margin.
const MAX_PAYLOAD: usize = 7_900;

/// What one supernode's transition changed, for the others to wake on.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Wake {
    /// The supernode that sent it ([`Shared::instance`]).
    pub(crate) from: u64,
    /// Jobs whose event streams grew.
    #[serde(default)]
    pub(crate) jobs: Vec<JobId>,
    /// `(owner, job)` whose state changed (`GET /api/v1/events`).
    #[serde(default)]
    pub(crate) job_list: Vec<(i64, JobId)>,
    /// The scheduler may place a job now.
    #[serde(default)]
    pub(crate) scheduler: bool,
    /// Too much to list: wake every follower.
    #[serde(default)]
    pub(crate) all: bool,
}

impl Wake {
    /// Adds what `other` wakes to `self`'s.
    pub(crate) fn merge(&mut self, other: Wake) {
        for job in other.jobs {
            if !self.jobs.contains(&job) {
                self.jobs.push(job);
            }
        }
        for change in other.job_list {
            if !self.job_list.contains(&change) {
                self.job_list.push(change);
            }
        }
        self.scheduler |= other.scheduler;
        self.all |= other.all;
    }

    /// What `fx` tells other supernodes.
    pub(crate) fn of(from: u64, fx: &Effects) -> Wake {
        Wake {
            from,
            jobs: fx.jobs.iter().copied().collect(),
            job_list: fx.job_list.clone(),
            scheduler: fx.wake_scheduler || !fx.forget_peers.is_empty(),
            all: false,
        }
    }

    /// The NOTIFY payload: the JSON of `self`, or of "wake everything"
    /// when that is too long.
    pub(crate) fn payload(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        if text.len() <= MAX_PAYLOAD {
            return text;
        }
        serde_json::to_string(&Wake {
            from: self.from,
            scheduler: self.scheduler,
            all: true,
            ..Wake::default()
        })
        .unwrap_or_default()
    }
}

/// A supernode's part in sharing a database.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Random, per process: tells its own notifications from others'.
    pub(crate) instance: u64,
    /// The generation this supernode's derived state reflects.
    generation: i64,
    /// The connection's write count when the transition began.
    writes_at_enter: u64,
    /// [`Core::shared_fingerprint`] when the transition began.
    fingerprint_at_enter: u64,
    /// The transition began by reading what others changed.
    pub(crate) resynced: bool,
}

impl Shared {
    pub(crate) fn new(generation: i64) -> Shared {
        Shared {
            // Never 0, which stands for "not shared".
            instance: rand::random::<u64>() | 1,
            generation,
            writes_at_enter: 0,
            fingerprint_at_enter: 0,
            resynced: false,
        }
    }
}

/// The generation the database is at.
pub(crate) fn generation(conn: &Connection) -> Result<i64, Error> {
    Ok(conn.query_row("SELECT generation FROM bspweb_generation", [], |r| r.get(0))?)
}

/// At the start of a transition: takes the lock and, if another supernode
/// wrote since this one last looked, rebuilds the derived state.
pub(crate) fn enter(core: &mut Core, inner: &Inner) -> Result<(), Error> {
    let Some(writes) = core.conn.postgres_conn().map(|c| c.writes()) else {
        return Ok(());
    };
    core.conn
        .query_row("SELECT pg_advisory_lock(?1)", [WRITE_LOCK], |_| Ok(()))?;
    set_holds_lock(&core.conn, true);
    let now = match generation(&core.conn) {
        Ok(g) => g,
        Err(e) => {
            unlock(&core.conn);
            return Err(e);
        }
    };
    let stale = core.shared.as_ref().is_some_and(|s| s.generation != now);
    if stale {
        tracing::debug!(
            now,
            "another supernode changed the shared state: reading it again"
        );
        if let Err(e) = core.resync(inner) {
            unlock(&core.conn);
            return Err(e);
        }
    }
    let fingerprint = core.shared_fingerprint(inner);
    if let Some(s) = core.shared.as_mut() {
        s.generation = now;
        s.writes_at_enter = writes;
        s.fingerprint_at_enter = fingerprint;
        s.resynced = stale;
    }
    Ok(())
}

/// Tells the connection whether a transition holds the shared lock on it
/// (then a lost connection fails the transition instead of reconnecting).
pub(crate) fn set_holds_lock(conn: &Connection, held: bool) {
    if let Some(c) = conn.postgres_conn() {
        c.set_holds_lock(held);
    }
}

/// At the end of a transition (`fx`: its effects, `None` when it failed):
/// tells the other supernodes what changed, if anything did, and releases
/// the lock. A committed transaction that wrote moved the generation on
/// already ([`crate::sql`]'s PostgreSQL engine); a write outside one that
/// the others must read (the DHHT, the accounts, an effect to tell)
/// moves it here.
pub(crate) fn leave(core: &mut Core, inner: &Inner, fx: Option<&Effects>) {
    let Some((writes, committed)) = core
        .conn
        .postgres_conn()
        .map(|c| (c.writes(), c.generation()))
    else {
        return;
    };
    let fingerprint = core.shared_fingerprint(inner);
    let Some(shared) = core.shared.as_mut() else {
        return;
    };
    let mut moved = committed.is_some_and(|g| g > shared.generation);
    if let Some(g) = committed.filter(|_| moved) {
        shared.generation = g;
    }
    // Only what the others must read again moves the generation on: a
    // change of the DHHT or the accounts, or an effect to tell (commands,
    // events, job lists, lost peers, the scheduler).
    let to_tell = fx.is_some_and(|fx| {
        !fx.commands.is_empty()
            || !fx.jobs.is_empty()
            || !fx.job_list.is_empty()
            || !fx.forget_peers.is_empty()
            || fx.wake_scheduler
            || fingerprint != shared.fingerprint_at_enter
    });
    if !moved && to_tell && writes != shared.writes_at_enter {
        match core.conn.query_row(
            "UPDATE bspweb_generation SET generation = generation + 1 RETURNING generation",
            [],
            |r| r.get::<_, i64>(0),
        ) {
            Ok(g) => {
                shared.generation = g;
                moved = true;
            }
            Err(e) => tracing::error!(error = %e, "cannot move the shared generation on"),
        }
    }
    if moved {
        let wake = fx.map_or_else(
            || Wake {
                from: shared.instance,
                all: true,
                scheduler: true,
                ..Wake::default()
            },
            |fx| Wake::of(shared.instance, fx),
        );
        if let Err(e) = core.conn.query_row(
            "SELECT pg_notify(?1, ?2)",
            crate::sql::params![CHANNEL, wake.payload()],
            |_| Ok(()),
        ) {
            tracing::error!(error = %e, "cannot notify the other supernodes");
        }
    }
    unlock(&core.conn);
}

fn unlock(conn: &Connection) {
    set_holds_lock(conn, false);
    if let Err(e) = conn.query_row("SELECT pg_advisory_unlock(?1)", [WRITE_LOCK], |_| Ok(())) {
        // A lost connection released it with its session.
        tracing::warn!(error = %e, "cannot release the shared lock");
    }
}

/// The JWT secret all supernodes of the database share, made by the first.
pub(crate) fn secret(conn: &mut Connection) -> Result<Vec<u8>, Error> {
    let tx = conn.transaction()?;
    let found: Option<Vec<u8>> = tx
        .query_row(
            "SELECT value FROM bspweb_secrets WHERE name = 'jwt'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    let secret = match found {
        Some(s) if s.len() >= 32 => s,
        Some(_) => {
            return Err(Error::Internal(
                "the JWT secret in bspweb_secrets is shorter than 32 bytes; delete its row to \
                 have a new one made (every login becomes invalid)"
                    .into(),
            ));
        }
        None => {
            let secret: [u8; 32] = rand::random();
            tx.execute(
                "INSERT INTO bspweb_secrets (name, value) VALUES ('jwt', ?1)",
                [secret.to_vec()],
            )?;
            secret.to_vec()
        }
    };
    tx.commit()?;
    Ok(secret)
}

/// LISTENs for the other supernodes' notifications and wakes what they
/// name, reconnecting with back-off; runs until the supernode stops.
pub(crate) async fn listen_task(sn: Supernode, config: tokio_postgres::Config) {
    let mut backoff = Duration::from_millis(100);
    let mut first = true;
    loop {
        match listen_once(&sn, &config, std::mem::take(&mut first)).await {
            Ok(()) => return,
            Err(e) => tracing::warn!(
                error = %e,
                "lost the notifications of the other supernodes; listening again in {backoff:?}"
            ),
        }
        let mut stop = sn.inner.shutdown_signal();
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stopped(&mut stop) => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// One connection's worth of [`listen_task`] (`first`: since the
/// supernode started); `Ok` when the supernode stops.
async fn listen_once(
    sn: &Supernode,
    config: &tokio_postgres::Config,
    first: bool,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                    let _ = tx.send(Ok(n.payload().to_string()));
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
    });
    let result = async {
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        // What was missed while not listening (after a lost connection;
        // at start the state was just read): everything may have changed.
        if !first {
            sn.wake_from_elsewhere(Wake {
                all: true,
                scheduler: true,
                ..Wake::default()
            })
            .await;
        }
        let mut stop = sn.inner.shutdown_signal();
        // A notification can be lost (a supernode killed between its commit
        // and its NOTIFY): every few seconds, read what changed anyway and
        // wake every follower if anything had.
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if sn.read_shared_changes().await == Some(true) {
                        sn.wake_from_elsewhere(Wake { all: true, scheduler: true, ..Wake::default() }).await;
                    }
                }
                message = rx.recv() => {
                    let mut wake: Option<Wake> = None;
                    let mut next = message;
                    loop {
                        match next {
                            Some(Ok(payload)) => match serde_json::from_str::<Wake>(&payload) {
                                Ok(w) if w.from == sn.instance() => {}
                                Ok(w) => match &mut wake {
                                    Some(all) => all.merge(w),
                                    None => wake = Some(w),
                                },
                                Err(e) => tracing::warn!(error = %e, "an unreadable notification on the shared channel"),
                            },
                            Some(Err(e)) => return Err(e),
                            None => return Ok(()),
                        }
                        // Everything that arrived meanwhile, acted on at once.
                        match rx.try_recv() {
                            Ok(m) => next = Some(m),
                            Err(_) => break,
                        }
                    }
                    if let Some(wake) = wake {
                        tracing::debug!(?wake, "another supernode changed the shared state");
                        sn.wake_from_elsewhere(wake).await;
                        // What comes next waits a little, to be acted on
                        // with what follows it.
                        tokio::select! {
                            () = tokio::time::sleep(COALESCE) => {}
                            () = stopped(&mut stop) => return Ok(()),
                        }
                    }
                }
                () = stopped(&mut stop) => return Ok(()),
            }
        }
    }
    .await;
    driver.abort();
    result
}

/// Once the supernode stops.
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Notifications acted on together wake what any of them would have,
    /// each job once.
    #[test]
    fn merged_wakes_wake_everything_each_would() {
        let mut w = Wake {
            from: 7,
            jobs: vec![1, 2],
            job_list: vec![(10, 1)],
            ..Wake::default()
        };
        w.merge(Wake {
            from: 9,
            jobs: vec![2, 3],
            job_list: vec![(10, 1), (11, 3)],
            scheduler: true,
            all: false,
        });
        assert_eq!(w.jobs, vec![1, 2, 3]);
        assert_eq!(w.job_list, vec![(10, 1), (11, 3)]);
        assert!(w.scheduler && !w.all);
        w.merge(Wake {
            all: true,
            ..Wake::default()
        });
        assert!(w.all);
    }

    #[test]
    fn a_long_wake_becomes_wake_everything() {
        let mut w = Wake {
            from: 7,
            jobs: (0..10).collect(),
            scheduler: true,
            ..Wake::default()
        };
        let short: Wake = serde_json::from_str(&w.payload()).unwrap();
        assert_eq!(short, w);
        w.jobs = (0..5_000).collect();
        let long: Wake = serde_json::from_str(&w.payload()).unwrap();
        assert!(long.all && long.scheduler && long.jobs.is_empty() && long.from == 7);
        assert!(w.payload().len() <= MAX_PAYLOAD);
    }
}
