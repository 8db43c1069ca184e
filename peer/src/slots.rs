//! The peer's slots: how many processes run guest code at once (one per
//! core by default), shared between jobs by time slicing (issue 20,
//! finding 5).
//!
//! A process takes a slot to run and gives it back when it syncs. Without
//! more, a process that computes for a whole long superstep would hold its
//! slot that long and starve every other job on the peer. So while other
//! processes wait, a running process gives its slot up after a
//! [`QUANTUM`] of guest time: at its next epoch tick it queues again and its
//! thread parks until its turn comes back ([`Slot::share`]). Free slots go
//! to the waiting jobs in round-robin order, one process of each job in
//! turn, so a job with many processes cannot crowd out one with few.
//!
//! Parked processes keep their threads, so at most [`MAX_PARKED`] park at
//! once; beyond that a process keeps its slot (the runtime's blocking
//! thread pool must never fill with parked threads while a process holding
//! a slot waits for a thread).
//!
//! The state is a plain mutex: every operation is a few queue steps.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bsp_api::JobId;
use tokio::sync::oneshot;

/// Guest time a process may run while others wait before it gives its
/// slot up.
pub const QUANTUM: Duration = Duration::from_millis(50);

/// Processes parked in [`Slot::share`] at most.
pub const MAX_PARKED: usize = 64;

/// One waiter's way to hear that it got the slot.
enum Waiter {
    Async(oneshot::Sender<()>),
    Blocking(std::sync::mpsc::SyncSender<()>),
}

impl Waiter {
    /// Hand the slot over; false if the waiter is gone.
    fn grant(self) -> bool {
        match self {
            Waiter::Async(tx) => tx.send(()).is_ok(),
            Waiter::Blocking(tx) => tx.send(()).is_ok(),
        }
    }
}

#[derive(Default)]
struct State {
    free: usize,
    parked: usize,
    /// Waiters of each job, in arrival order.
    queues: HashMap<JobId, VecDeque<Waiter>>,
    /// Jobs with waiters, in the order they get the next free slots.
    turns: VecDeque<JobId>,
    closed: bool,
}

impl State {
    fn waiting(&self) -> bool {
        !self.turns.is_empty()
    }

    fn enqueue(&mut self, job: JobId, w: Waiter) {
        let q = self.queues.entry(job).or_default();
        if q.is_empty() {
            self.turns.push_back(job);
        }
        q.push_back(w);
    }

    /// A slot came free: give it to the first waiter of the job whose turn
    /// it is (that job goes to the back), or keep it free.
    fn release(&mut self) {
        while let Some(job) = self.turns.pop_front() {
            let Some(q) = self.queues.get_mut(&job) else {
                continue;
            };
            let next = q.pop_front();
            if q.is_empty() {
                self.queues.remove(&job);
            } else {
                self.turns.push_back(job);
            }
            if let Some(w) = next
                && w.grant()
            {
                return;
            }
        }
        self.free += 1;
    }
}

/// The peer's slots. Cheap to share behind an `Arc`.
pub struct Slots {
    state: Mutex<State>,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Slots")
            .field("free", &s.free)
            .field("parked", &s.parked)
            .field("jobs_waiting", &s.turns.len())
            .finish()
    }
}

/// The peer is shutting down: no more slots are given out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the peer is shutting down")]
pub struct Closed;

impl Slots {
    pub fn new(n: usize) -> Arc<Slots> {
        Arc::new(Slots {
            state: Mutex::new(State {
                free: n,
                ..State::default()
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for a slot for a process of `job`.
    /// A slot for `job` if one is free and nobody waits for one; `None`
    /// otherwise (then [`Slots::acquire`] queues fairly).
    pub fn try_acquire(self: &Arc<Self>, job: JobId) -> Option<Slot> {
        let mut s = self.lock();
        if s.closed || s.free == 0 || s.waiting() {
            return None;
        }
        s.free -= 1;
        drop(s);
        Some(self.slot(job))
    }

    pub async fn acquire(self: &Arc<Self>, job: JobId) -> Result<Slot, Closed> {
        let rx = {
            let mut s = self.lock();
            if s.closed {
                return Err(Closed);
            }
            if s.free > 0 && !s.waiting() {
                s.free -= 1;
                return Ok(self.slot(job));
            }
            let (tx, rx) = oneshot::channel();
            s.enqueue(job, Waiter::Async(tx));
            rx
        };
        // A grant to a waiter that gave up (its task was cancelled) fails
        // and goes to the next one; a grant that arrives is ours.
        let mut guard = Unclaimed {
            slots: self,
            rx: Some(rx),
        };
        let rx = guard.rx.as_mut().ok_or(Closed)?;
        match rx.await {
            Ok(()) => {
                guard.rx = None;
                Ok(self.slot(job))
            }
            Err(_) => {
                guard.rx = None;
                Err(Closed)
            }
        }
    }

    fn slot(self: &Arc<Self>, job: JobId) -> Slot {
        Slot {
            slots: self.clone(),
            job,
            since: Instant::now(),
            may_park: true,
        }
    }

    /// Give out no more slots: current and future waiters get [`Closed`].
    pub fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        s.turns.clear();
        s.queues.clear();
    }

    /// Free slots and waiting jobs, for status and tests.
    pub fn load(&self) -> (usize, usize) {
        let s = self.lock();
        (s.free, s.turns.len())
    }
}

/// Gives a slot granted to a cancelled `acquire` on.
struct Unclaimed<'a> {
    slots: &'a Arc<Slots>,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Unclaimed<'_> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                self.slots.lock().release();
            }
        }
    }
}

/// A slot held by one process; given back when dropped.
pub struct Slot {
    slots: Arc<Slots>,
    job: JobId,
    since: Instant,
    /// Whether [`Slot::share`] may park the thread.
    may_park: bool,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("job", &self.job).finish()
    }
}

impl Slot {
    /// This slot for a superstep that runs on a thread that must not park
    /// (the async runtime's, for a short superstep): [`Slot::share`] then
    /// keeps the slot, as when too many threads are parked already.
    pub fn never_park(mut self) -> Slot {
        self.may_park = false;
        self
    }

    /// Whether [`Slot::never_park`] holds (and [`Slot::may_park_again`]
    /// was not called since).
    pub fn pinned(&self) -> bool {
        !self.may_park
    }

    /// The thread became one that may park after all (the async runtime
    /// handed its duties to another thread).
    pub fn may_park_again(&mut self) {
        self.may_park = true;
    }

    /// How long since this slot was taken (or last came back after
    /// parking).
    pub fn held_for(&self) -> Duration {
        self.since.elapsed()
    }

    /// Called on the process's thread at an epoch tick: after a
    /// [`QUANTUM`] of holding the slot while others wait, queue again, give
    /// the slot to the next job's process and park this thread until the
    /// turn comes back. Returns how long it waited (not guest time).
    pub fn share(&mut self) -> Duration {
        if !self.may_park || self.since.elapsed() < QUANTUM {
            return Duration::ZERO;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        {
            let mut s = self.slots.lock();
            if !s.waiting() || s.parked >= MAX_PARKED || s.closed {
                drop(s);
                self.since = Instant::now();
                return Duration::ZERO;
            }
            s.parked += 1;
            s.enqueue(self.job, Waiter::Blocking(tx));
            s.release();
        }
        let parked = Instant::now();
        // The slot comes back through the channel; if the peer closed the
        // slots meanwhile (shutting down), go on without one.
        let _ = rx.recv();
        self.slots.lock().parked -= 1;
        self.since = Instant::now();
        parked.elapsed()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.lock().release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task that waits for a slot for `job`, once it is queued.
    async fn queued_waiter(
        slots: &Arc<Slots>,
        job: JobId,
    ) -> tokio::task::JoinHandle<Result<JobId, Closed>> {
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire(job).await.map(|s| s.job) }
        });
        while slots.load().1 == 0 {
            tokio::task::yield_now().await;
        }
        waiting
    }

    #[tokio::test]
    async fn slots_are_limited_and_come_back() {
        let slots = Slots::new(2);
        let a = slots.acquire(1).await.unwrap();
        let _b = slots.acquire(1).await.unwrap();
        assert_eq!(slots.load(), (0, 0));
        let waiting = queued_waiter(&slots, 2).await;
        drop(a);
        assert_eq!(waiting.await.unwrap(), Ok(2));
        assert_eq!(
            slots.load(),
            (1, 0),
            "the waiter's slot came back when it ended"
        );
    }

    /// `try_acquire` takes a free slot at once, but never one that a
    /// queued waiter is owed, and nothing once closed.
    #[tokio::test]
    async fn try_acquire_takes_only_a_free_slot_nobody_waits_for() {
        let slots = Slots::new(1);
        let a = slots.try_acquire(1).expect("a free slot");
        assert!(slots.try_acquire(1).is_none(), "none left");
        let waiting = queued_waiter(&slots, 2).await;
        drop(a);
        assert!(
            slots.try_acquire(3).is_none(),
            "the freed slot is the waiter's"
        );
        assert_eq!(waiting.await.unwrap(), Ok(2));
        let b = slots.try_acquire(3).expect("free again");
        drop(b);
        slots.close();
        assert!(slots.try_acquire(3).is_none(), "closed");
    }

    #[tokio::test]
    async fn free_slots_go_to_jobs_in_turn() {
        let slots = Slots::new(1);
        let held = slots.acquire(9).await.unwrap();
        // Job 1 queues three processes, job 2 one, job 3 one.
        let (tx, mut order) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for job in [1, 1, 1, 2, 3] {
            let tx = tx.clone();
            tasks.push(tokio::spawn({
                let slots = slots.clone();
                async move {
                    let s = slots.acquire(job).await.unwrap();
                    tx.send(job).unwrap();
                    drop(s);
                }
            }));
            // Let it queue before the next one (one thread: it runs now).
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(slots.load(), (0, 3));
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        let mut got = Vec::new();
        while let Ok(j) = order.try_recv() {
            got.push(j);
        }
        assert_eq!(got, vec![1, 2, 3, 1, 1]);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_does_not_lose_the_slot() {
        let slots = Slots::new(1);
        let held = slots.acquire(1).await.unwrap();
        let cancelled = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire(2).await.is_ok() }
        });
        while slots.load().1 == 0 {
            tokio::task::yield_now().await;
        }
        cancelled.abort();
        let _ = cancelled.await;
        drop(held);
        let again = slots.acquire(3).await.unwrap();
        assert_eq!(again.job, 3);
        drop(again);
        assert_eq!(slots.load(), (1, 0));
    }

    #[test]
    fn a_long_runner_shares_its_slot_with_waiting_jobs() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let slots = Slots::new(1);
        let mut long = rt.block_on(slots.acquire(1)).unwrap();
        // Nobody waits: sharing keeps the slot.
        long.since = Instant::now() - QUANTUM;
        assert_eq!(long.share(), Duration::ZERO);
        // Another job waits: the long runner parks until that one is done.
        let other = std::thread::spawn({
            let slots = slots.clone();
            move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                let s = rt.block_on(slots.acquire(2)).unwrap();
                std::thread::sleep(Duration::from_millis(20));
                drop(s);
            }
        });
        while slots.load().1 == 0 {
            std::thread::yield_now();
        }
        long.since = Instant::now() - QUANTUM;
        let waited = long.share();
        other.join().unwrap();
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        assert_eq!(slots.load(), (0, 0), "the long runner has the slot again");
        drop(long);
        assert_eq!(slots.load(), (1, 0));
    }

    #[tokio::test]
    async fn a_slot_that_must_not_park_keeps_running_while_others_wait() {
        let slots = Slots::new(1);
        let mut inline = slots.try_acquire(1).expect("a free slot").never_park();
        let waiting = queued_waiter(&slots, 2).await;
        inline.since = Instant::now() - QUANTUM;
        assert_eq!(inline.share(), Duration::ZERO, "it keeps its thread");
        assert_eq!(slots.load(), (0, 1), "and its slot; the other job waits");
        drop(inline);
        assert_eq!(waiting.await.unwrap(), Ok(2));
    }
}
