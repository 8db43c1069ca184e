//! Fetching the program: by Robber from the job's other peers, or from the
//! supernode, falling back to a direct download on a stall or a broken
//! distribution (`program`), then compiling it.

use super::*;

/// What getting the program takes: the download, Robber, and the
/// processes waiting for it.
pub(super) struct ProgramFetch {
    /// The program is here.
    pub(super) has_program: bool,
    /// Processes to start (fresh, restored) once the program is here.
    pub(super) deferred: Option<(Vec<Pid>, Vec<Pid>)>,
    /// The direct download is not started yet.
    pub(super) download_pending: bool,
    /// Robber spreading the program among the job's first peers.
    pub(super) dist: Option<program::Distribution>,
    /// When the last piece of the program arrived (or Robber started), ms.
    pub(super) dist_progress: u64,
    pub(super) dist_started: u64,
    /// The program's size, and the resources' hash (empty: none apart).
    pub(super) program_bytes: u64,
    pub(super) resources_hash: String,
    /// The program's and resources' size together (what Robber moves).
    pub(super) dist_bytes: u64,
    /// The resources that came with the download, while its program
    /// compiles (`Some` from the download to [`ProgramEvent::Compiled`]).
    pub(super) compiling: Option<Resources>,
}

impl ProgramFetch {
    pub(super) fn new(a: &JobAssignment) -> ProgramFetch {
        ProgramFetch {
            has_program: false,
            deferred: None,
            download_pending: true,
            dist: None,
            dist_progress: 0,
            dist_started: 0,
            program_bytes: a.program_bytes,
            resources_hash: a.resources_hash.clone(),
            dist_bytes: a.program_bytes.saturating_add(a.resources_bytes),
            compiling: None,
        }
    }
}

impl<I: JobIo> Machine<I> {
    /// Get the program: from the cache, by Robber from the job's other
    /// peers, or downloaded from the supernode (`crate::program`).
    pub(super) fn get_program(&mut self, a: &JobAssignment) {
        // A cached program is the whole bundle only for a job without
        // resources apart.
        let cached = self
            .io
            .cached_program()
            .filter(|_| a.resources_hash.is_empty());
        if program::Distribution::applies(a) {
            match program::Distribution::new(a, self.me) {
                Ok(mut dist) => {
                    let out = match &cached {
                        _ if dist.is_root() => Ok(Vec::new()),
                        Some((_, bytes)) => dist.seed(bytes),
                        None => Ok(dist.start()),
                    };
                    match out {
                        Ok(out) => {
                            let root = dist.is_root();
                            self.program.dist = Some(dist);
                            self.program.dist_started = self.now;
                            self.program.dist_progress = self.program.dist_started;
                            self.send_program_frames(out);
                            if root {
                                // From the cache or the supernode.
                                self.start_download();
                            }
                        }
                        Err(e) => tracing::info!(job = self.job, "no program distribution: {e}"),
                    }
                }
                Err(e) => tracing::info!(job = self.job, "no program distribution: {e}"),
            }
        }
        match cached {
            Some((module, _)) => self.program_ready(module, None),
            None if self.program.dist.is_none() => self.start_download(),
            None => {}
        }
    }

    pub(super) fn send_program_frames(&mut self, out: program::Out) {
        for (to, f) in out {
            self.send_to(to, f);
        }
    }

    /// How long a peer waits for the next piece of the program: the stall
    /// limit, plus (before the first piece) the time the first peer's own
    /// download takes at 1 MiB/s.
    pub(super) fn stall_allowance(&self) -> Duration {
        let first = self.program.dist.as_ref().is_some_and(|d| d.received == 0);
        let download = if first {
            Duration::from_secs_f64(self.program.dist_bytes as f64 / f64::from(1u32 << 20))
        } else {
            Duration::ZERO
        };
        program::STALL + download
    }

    /// Start the direct download (once).
    pub(super) fn start_download(&mut self) {
        if std::mem::take(&mut self.program.download_pending) {
            self.io.start_download();
        }
    }

    /// Robber failed here: download the program unless it is here already.
    pub(super) fn fall_back(&mut self, why: String) {
        if self.program.has_program {
            return;
        }
        if self.program.download_pending {
            tracing::info!(job = self.job, "downloading the program directly: {why}");
            self.status(format!(
                "peer #{} downloads the program directly: {why}",
                self.me
            ));
        }
        // A void distribution stops answering; the others fall back too.
        self.program.dist = None;
        self.start_download();
    }

    pub(super) fn on_program(&mut self, event: ProgramEvent<I::Program>) {
        match event {
            ProgramEvent::Downloaded(Ok(f)) => {
                let resources = match unpack_resources(
                    &self.program.resources_hash,
                    &f.resources,
                    Source::Supernode,
                ) {
                    Ok(r) => r,
                    Err(e) => return self.fail(None, e.to_string()),
                };
                if let Some(dist) = &mut self.program.dist {
                    let bundle = [&f.bytes[..], &f.resources[..]].concat();
                    match dist.seed(&bundle) {
                        Ok(out) => {
                            if dist.is_root() {
                                let n = self.peers.len() - 1;
                                self.status(format!(
                                    "peer #{} downloaded the program ({} KiB) and passes it on to {n} peer{} by Robber{}",
                                    self.me,
                                    f.bytes.len() >> 10,
                                    if n == 1 { "" } else { "s" },
                                    clusters_phrase(self.routing.sites.values())
                                ));
                            }
                            self.send_program_frames(out);
                        }
                        Err(e) => {
                            tracing::info!(job = self.job, "the program's distribution ends: {e}");
                            self.program.dist = None;
                        }
                    }
                }
                // The pieces are offered to the other peers before this
                // one compiles: their compiles run beside its own.
                match f.module {
                    Some(module) => self.program_ready(module, resources),
                    None if self.program.has_program || self.program.compiling.is_some() => {}
                    None => {
                        self.program.compiling = Some(resources);
                        self.io.compile(f.bytes);
                    }
                }
            }
            ProgramEvent::Compiled(Ok(module)) => {
                if let Some(resources) = self.program.compiling.take() {
                    self.program_ready(module, resources);
                }
            }
            ProgramEvent::Downloaded(Err(reason)) | ProgramEvent::Compiled(Err(reason)) => {
                self.program.compiling = None;
                if !self.program.has_program {
                    self.fail(None, reason.to_string());
                }
            }
            ProgramEvent::Assembled(Ok((module, resources))) => {
                if let Some(dist) = &self.program.dist {
                    let ms = self.now.saturating_sub(self.program.dist_started);
                    let sources = dist.sources.len();
                    self.status(format!(
                        "peer #{} got the program by Robber in {ms} ms: {} pieces from {sources} peer{}",
                        self.me,
                        dist.received,
                        if sources == 1 { "" } else { "s" }
                    ));
                }
                self.program_ready(module, resources);
            }
            ProgramEvent::Assembled(Err(e)) => self.fall_back(e.to_string()),
        }
    }

    /// A program frame from `from`.
    pub(super) fn on_program_msg(
        &mut self,
        from: PeerId,
        epoch: u64,
        msg: bsp_api::wire::ProgramMsg,
    ) {
        let Some(dist) = &mut self.program.dist else {
            return;
        };
        if epoch != dist.epoch {
            return; // another distribution (a peer that joined later)
        }
        let had = dist.has_all();
        let received = dist.received;
        match dist.on_msg(from, msg) {
            Ok(out) => {
                if dist.received > received {
                    self.program.dist_progress = self.now;
                }
                let complete = !had && dist.has_all() && !self.program.has_program;
                let data = if complete { dist.data() } else { None };
                self.send_program_frames(out);
                if let Some(bundle) = data {
                    let split = (self.program.program_bytes as usize).min(bundle.len());
                    self.io.assemble(bundle, split);
                }
            }
            Err(e) => {
                tracing::info!(job = self.job, "{e}");
                self.fall_back(e.to_string());
            }
        }
    }

    /// The program (and the resources, when they came apart) is here:
    /// start the processes that waited for it.
    pub(super) fn program_ready(&mut self, module: I::Program, resources: Resources) {
        if self.program.has_program {
            return;
        }
        self.io.program_ready(module, resources);
        self.program.has_program = true;
        if let Some((fresh, restored)) = self.program.deferred.take() {
            // Only what this peer still hosts (the placement may have
            // changed while the program was on its way).
            let here = |p: &Pid| self.hosts.runs(*p, self.me);
            let restored: Vec<Pid> = restored.into_iter().filter(here).collect();
            let fresh: Vec<Pid> = fresh
                .into_iter()
                .filter(|p| here(p) && !restored.contains(p))
                .collect();
            for pid in restored {
                self.begin_fetch(pid);
            }
            self.start_fresh(fresh);
        }
    }
}
