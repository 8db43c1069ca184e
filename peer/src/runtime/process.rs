//! A running process ([`Process`]): resuming it, checkpointing and restoring
//! its state, and what a trap or a stop means for the job.

use super::*;

/// A running BSP process: its store and instance.
pub struct Process {
    pub(super) store: Store<ProcState>,
    pub(super) resume: TypedFunc<(), i32>,
    /// Asyncify's state (C guests): checked to be at rest (0) after every
    /// resume, so a checkpoint never records a half-unwound stack.
    pub(super) asyncify_state: Option<TypedFunc<(), i32>>,
    /// Mutable globals, checkpointed with memory.
    pub(super) globals: Vec<Global>,
    pub(super) ended: bool,
    /// The kernel's record of the pages written since the last capture
    /// (`dirty`), where the system offers it; set up at the first capture
    /// (a descriptor per process that checkpoints, none for others).
    pub(super) writes: Option<crate::dirty::Tracking>,
    pub(super) writes_tried: bool,
    /// How long its recent supersteps took, for the driver's choice of
    /// thread ([`ShortRuns`]).
    pub(super) runs: ShortRuns,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("pid", &self.store.data().host.pid)
            .field("superstep", &self.store.data().host.superstep)
            .field("ended", &self.ended)
            .finish()
    }
}

impl Process {
    /// This process's id.
    pub fn pid(&self) -> Pid {
        self.store.data().host.pid
    }

    /// Whether its next superstep is expected to be short enough to run on
    /// the job driver's thread ([`ShortRuns`]).
    pub fn predicts_short(&self) -> bool {
        self.runs.predicts_short()
    }

    /// Record whether a superstep, with its capture if any, was short
    /// ([`ShortRuns::note`]); `inline`: it ran on the job driver's thread.
    pub fn note_run(&mut self, short: bool, inline: bool) {
        self.runs.note(short, inline);
    }

    /// The current superstep.
    pub fn superstep(&self) -> u32 {
        self.store.data().host.superstep
    }

    /// The reporter mark of the last output record this process emitted
    /// (0: none since it was instantiated or restored).
    pub fn output_mark(&self) -> u64 {
        self.store.data().output_mark
    }

    /// The checkpointable host state.
    pub fn host_state(&self) -> &HostState {
        &self.store.data().host
    }

    /// Snapshot this process at the end of superstep [`Process::superstep`]
    /// through `tracker`: memory (copied once, in the same pass as change
    /// detection; nothing when `exited`), mutable globals, output
    /// counters, `exited` and `outbox` (the messages sent in the superstep,
    /// from [`Process::take_outbox`]). The snapshot's hash is set.
    ///
    /// Call it only after [`Process::resume`] returned [`Outcome::Sync`] or
    /// [`Outcome::Done`] (no wasm frame is live then, so the stack pointer
    /// is at its initial value and memory plus globals is the whole state),
    /// and before [`Process::begin_superstep`] of the next superstep.
    pub fn checkpoint(
        &mut self,
        tracker: &mut PageTracker,
        outbox: Vec<WireMessage>,
        exited: bool,
    ) -> Snapshot {
        self.checkpoint_into(tracker, outbox, exited, None)
    }

    /// [`Process::checkpoint`] that recycles `previous`, a recent snapshot
    /// `tracker` took (unmodified), copying only the pages that changed
    /// ([`PageTracker::capture_reusing`]). Use it when the previous snapshot
    /// is no longer needed (its replicas acknowledged it).
    pub fn checkpoint_reusing(
        &mut self,
        tracker: &mut PageTracker,
        outbox: Vec<WireMessage>,
        exited: bool,
        previous: Snapshot,
    ) -> Snapshot {
        self.checkpoint_into(tracker, outbox, exited, Some(previous))
    }

    fn checkpoint_into(
        &mut self,
        tracker: &mut PageTracker,
        outbox: Vec<WireMessage>,
        exited: bool,
        previous: Option<Snapshot>,
    ) -> Snapshot {
        let globals: Vec<u64> = self
            .globals
            .iter()
            .map(|g| val_bits(&g.get(&mut self.store)))
            .collect();
        let host = &self.store.data().host;
        let head = Snapshot {
            globals,
            output_seq: host.output_seq,
            output_bytes: host.output_bytes,
            exited,
            outbox,
            ..Snapshot::head(host.pid, host.superstep)
        };
        let memory: &[u8] = match self.store.data().memory {
            Some(m) => m.data(&self.store),
            None => &[],
        };
        if !self.writes_tried {
            self.writes_tried = true;
            self.writes = crate::dirty::Tracking::new();
        }
        // The pages the kernel saw written since the last capture (hot pages
        // always); with no answer, every page is read.
        let may = match self.writes.as_mut() {
            Some(w) if !exited => {
                let may = w.may_have_changed(memory, tracker.last_capture());
                if may.is_none() {
                    self.writes = None;
                }
                may
            }
            _ => None,
        };
        let snapshot =
            tracker.capture_tracked(head, memory, previous, may.as_deref().unwrap_or(&[]));
        if let Some(w) = self.writes.as_mut().filter(|_| may.is_some()) {
            let at = tracker.last_capture();
            if !w.after_capture(memory, at, |k| tracker.leaf_changed_at_last_capture(k)) {
                tracing::debug!("write tracking failed; every page is hashed from now on");
                self.writes = None;
            }
        }
        snapshot
    }

    /// A copy of linear memory (tests compare captures with it).
    #[cfg(test)]
    pub(crate) fn memory_bytes(&self) -> Vec<u8> {
        match self.store.data().memory {
            Some(m) => m.data(&self.store).to_vec(),
            None => Vec::new(),
        }
    }

    /// 4 KiB leaves of memory write-protected as cold; `None`: no tracking.
    #[cfg(test)]
    pub(crate) fn cold_pages(&self) -> Option<usize> {
        self.writes.as_ref().map(crate::dirty::Tracking::cold_pages)
    }

    /// Flip one bit in the middle of linear memory (test-only fault
    /// injection, [`crate::fault`]).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn corrupt_memory(&mut self) {
        if let Some(m) = self.store.data().memory {
            let data = m.data_mut(&mut self.store);
            if !data.is_empty() {
                let i = data.len() / 2;
                data[i] ^= 1;
            }
        }
    }

    /// Take the messages sent since the last call.
    pub fn take_outbox(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.store.data_mut().outbox)
    }

    /// Enter superstep `superstep` with these messages (already sorted by
    /// source and send order): resets the superstep's time and message budget.
    pub fn begin_superstep(&mut self, superstep: u32, inbox: Vec<Message>) {
        let s = self.store.data_mut();
        s.host.superstep = superstep;
        s.host.inbox = inbox;
        s.outbox.clear();
        s.outbox_bytes = 0;
        s.send_seq = 0;
        s.send_tag = 0;
        s.used = Duration::ZERO;
    }

    /// [`Process::resume`] in `slot`, which it shares with other jobs'
    /// processes while it runs ([`crate::slots`]) and gives back at the end.
    pub fn resume_in(&mut self, slot: crate::slots::Slot) -> Outcome {
        self.store.data_mut().slot = Some(slot);
        let outcome = self.resume();
        self.store.data_mut().slot = None;
        outcome
    }

    /// Run the program until it syncs, returns, yields or is stopped.
    /// Blocks the calling thread: call it from a blocking thread.
    pub fn resume(&mut self) -> Outcome {
        if self.ended {
            return Outcome::Failed("the process has already ended".into());
        }
        set_thread_niceness_once();
        let job = self.store.data().job.clone();
        if job.kill.load(Ordering::Relaxed) {
            self.ended = true;
            return Outcome::Failed(Stop::Killed.to_string());
        }
        let start = Instant::now();
        {
            let s = self.store.data_mut();
            s.deadline = start + job.superstep_budget.saturating_sub(s.used);
            s.stop = None;
            s.parked = Duration::ZERO;
        }
        self.store.set_epoch_deadline(1);
        let result = self.resume.call(&mut self.store, ());
        let s = self.store.data_mut();
        s.used += start.elapsed().saturating_sub(s.parked);
        let outcome = match result {
            Ok(STATUS_SYNC) => Outcome::Sync,
            Ok(STATUS_DONE) => Outcome::Done,
            Ok(STATUS_YIELD) => Outcome::Yield,
            Ok(other) => Outcome::Failed(format!(
                "`{RESUME_EXPORT}` returned the unknown status {other}; expected {STATUS_SYNC} (sync), {STATUS_DONE} (done) or {STATUS_YIELD} (yield)"
            )),
            Err(e) => classify(self.store.data_mut().stop.take(), &e),
        };
        let outcome = match (&outcome, &self.asyncify_state) {
            (Outcome::Sync | Outcome::Yield | Outcome::Done, Some(state)) => {
                match state.call(&mut self.store, ()) {
                    Ok(0) => outcome,
                    Ok(n) => Outcome::Failed(format!(
                        "`{RESUME_EXPORT}` returned while Asyncify was {} (state {n}); the C runtime must stop unwinding before it returns to the host",
                        if n == 1 { "unwinding" } else { "rewinding" }
                    )),
                    Err(e) => Outcome::Failed(format!(
                        "`{ASYNCIFY_STATE_EXPORT}` failed after a resume: {e}"
                    )),
                }
            }
            _ => outcome,
        };
        if !matches!(outcome, Outcome::Sync | Outcome::Yield) {
            self.ended = true;
        }
        outcome
    }
}

/// Turn a failed call into an outcome with a readable reason.
pub(super) fn classify(stop: Option<Stop>, e: &wasmtime::Error) -> Outcome {
    let stop = stop.or_else(|| e.downcast_ref::<Stop>().cloned());
    match stop {
        Some(Stop::Abort(reason)) => Outcome::Aborted(reason),
        Some(stop) => Outcome::Failed(stop.to_string()),
        None => {
            let frames = e
                .downcast_ref::<WasmBacktrace>()
                .map(describe_backtrace)
                .unwrap_or_default();
            match e.downcast_ref::<Trap>() {
                Some(trap) => {
                    let text = trap.to_string();
                    let text = text.strip_prefix("wasm trap: ").unwrap_or(&text);
                    Outcome::Failed(format!("the process trapped: {text}{frames}"))
                }
                None => Outcome::Failed(format!("the process failed: {e}{frames}")),
            }
        }
    }
}

pub(super) fn describe_backtrace(bt: &WasmBacktrace) -> String {
    let frames: Vec<String> = bt
        .frames()
        .iter()
        .take(8)
        .map(|f| match f.func_name() {
            Some(name) => demangle(name),
            None => format!("function #{}", f.func_index()),
        })
        .collect();
    if frames.is_empty() {
        String::new()
    } else {
        format!(" (in {})", frames.join(" <- "))
    }
}

/// Readable form of a Rust (legacy-mangled) symbol such as
/// `_ZN6bspweb2rt6resume17h0123456789abcdefE` → `bspweb::rt::resume`; other
/// names are returned unchanged.
pub(super) fn demangle(name: &str) -> String {
    let Some(mut rest) = name.strip_prefix("_ZN").and_then(|r| r.strip_suffix('E')) else {
        return name.to_string();
    };
    let mut parts = Vec::new();
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let Ok(len) = rest[..digits].parse::<usize>() else {
            return name.to_string();
        };
        let Some(part) = rest.get(digits..digits + len) else {
            return name.to_string();
        };
        // A segment that starts with `$` is mangled with a leading `_`.
        parts.push(part.strip_prefix("_$").map_or(part, |_| &part[1..]));
        rest = &rest[digits + len..];
    }
    if let Some(last) = parts.last()
        && last.len() == 17
        && last.starts_with('h')
        && last[1..].bytes().all(|b| b.is_ascii_hexdigit())
    {
        parts.pop();
    }
    let mut out = parts.join("::");
    for (from, to) in [
        ("$LT$", "<"),
        ("$GT$", ">"),
        ("$RF$", "&"),
        ("$BP$", "*"),
        ("$C$", ","),
        ("$LP$", "("),
        ("$RP$", ")"),
        ("$SP$", "@"),
        ("$u20$", " "),
        ("$u27$", "'"),
        ("$u5b$", "["),
        ("$u5d$", "]"),
        ("$u7b$", "{"),
        ("$u7d$", "}"),
        ("$u7e$", "~"),
        ("..", "::"),
    ] {
        out = out.replace(from, to);
    }
    out
}

/// How long a superstep that runs on an async worker thread (a short one,
/// run inline by its job's driver) may go on there before it hands the
/// worker's duties to another thread.
pub const INLINE_HAND_OFF_AFTER: Duration = Duration::from_millis(1);

/// Run `wait`, which blocks until something else on the peer happens: on
/// an async worker thread (`slot` is pinned: an inline superstep), inside
/// tokio's `block_in_place`, so that the worker's other tasks (the upload
/// it waits for, say) run on another thread meanwhile.
pub(super) fn off_async_worker<R>(
    slot: &Option<crate::slots::Slot>,
    wait: impl FnOnce() -> R,
) -> R {
    if slot.as_ref().is_some_and(|s| s.pinned()) && on_multi_thread_runtime() {
        tokio::task::block_in_place(wait)
    } else {
        wait()
    }
}

/// Whether the calling thread is in a multi-threaded tokio runtime (where
/// `block_in_place` works).
pub(crate) fn on_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// An inline superstep (see [`off_async_worker`]) that has run for
/// [`INLINE_HAND_OFF_AFTER`] was predicted wrongly: hand the worker's duties
/// to another thread and go on as on a blocking thread, whose slot may park.
/// `block_in_place` takes the worker back if the thread it starts has not
/// taken over by the time its closure returns, so the closure waits a
/// moment for that.
pub(super) fn hand_off_long_inline_run(slot: &mut Option<crate::slots::Slot>) {
    let Some(slot) = slot.as_mut().filter(|s| s.pinned()) else {
        return;
    };
    if slot.held_for() < INLINE_HAND_OFF_AFTER {
        return;
    }
    if on_multi_thread_runtime() {
        tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(1)));
    }
    slot.may_park_again();
}

pub(super) fn on_epoch(
    mut ctx: StoreContextMut<'_, ProcState>,
) -> wasmtime::Result<UpdateDeadline> {
    let s = ctx.data_mut();
    if s.job.kill.load(Ordering::Relaxed) {
        return Err(s.stop_with(Stop::Killed));
    }
    hand_off_long_inline_run(&mut s.slot);
    if let Some(slot) = s.slot.as_mut() {
        // Time parked while other jobs ran is not this superstep's time.
        let parked = slot.share();
        if !parked.is_zero() {
            s.deadline += parked;
            s.parked += parked;
            if s.job.kill.load(Ordering::Relaxed) {
                return Err(s.stop_with(Stop::Killed));
            }
        }
    }
    if Instant::now() >= s.deadline {
        let stop = Stop::TimeLimit {
            superstep: s.host.superstep,
            secs: s.job.superstep_budget.as_secs_f64(),
        };
        return Err(s.stop_with(stop));
    }
    Ok(UpdateDeadline::Continue(1))
}
