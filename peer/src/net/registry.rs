//! The jobs this peer holds assignments for, as the listener sees them
//! ([`Registry`]): their keys, members and live connections, and the
//! [`Inbound`] events it forwards to each.

use super::*;

/// What the data plane tells a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// Peer `from` opened its connection to us and was welcomed.
    Connected { from: PeerId },
    /// A frame from peer `from`, in the order it was sent.
    Frame { from: PeerId, frame: Frame },
    /// The connection from `from` ended: `None` for a clean close, else why.
    Closed { from: PeerId, error: Option<String> },
    /// Our connection to `to` could not be opened or broke.
    SendFailed { to: PeerId, error: String },
    /// The job ended on peer `to` (it said so before closing our
    /// connection): do not reconnect or re-send.
    PeerEnded { to: PeerId },
}

pub(super) struct Entry {
    pub(super) key: JobKey,
    pub(super) me: PeerId,
    pub(super) peers: HashSet<PeerId>,
    /// The live connection from each peer; a newer one replaces it (the
    /// peer reconnected after its connection broke).
    pub(super) connected: HashMap<PeerId, CancellationToken>,
    pub(super) tx: mpsc::Sender<Inbound>,
}

/// The jobs this peer's listener admits connections for, and the link
/// probes it answers.
#[derive(Default)]
pub struct Registry {
    pub(super) jobs: Mutex<HashMap<JobId, Entry>>,
    pub(super) links: Arc<crate::links::Links>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry that answers link probes with `links`.
    pub fn with_links(links: Arc<crate::links::Links>) -> Self {
        Registry {
            jobs: Mutex::default(),
            links,
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, Entry>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admit connections for `job` from `peers` (other than `me`) under the
    /// key of the job's `token`. Returns the job's event channel: a sender (for the job's own
    /// outbound writers) and the receiver. Replaces an earlier registration.
    pub fn register(
        &self,
        job: JobId,
        token: &str,
        me: PeerId,
        peers: impl IntoIterator<Item = PeerId>,
    ) -> (mpsc::Sender<Inbound>, mpsc::Receiver<Inbound>) {
        let (tx, rx) = mpsc::channel(INBOUND_QUEUE);
        let entry = Entry {
            key: JobKey::derive(token),
            me,
            peers: peers.into_iter().filter(|p| *p != me).collect(),
            connected: HashMap::new(),
            tx: tx.clone(),
        };
        if let Some(old) = self.lock().insert(job, entry) {
            for c in old.connected.values() {
                c.cancel();
            }
        }
        (tx, rx)
    }

    /// Stop admitting connections for the run of `job` that
    /// [`Registry::register`] gave `tx` (a later registration of the same
    /// job, under a newer identity or for a run that took over, stays).
    pub fn unregister(&self, job: JobId, tx: &mpsc::Sender<Inbound>) {
        let mut jobs = self.lock();
        if jobs.get(&job).is_some_and(|e| e.tx.same_channel(tx))
            && let Some(e) = jobs.remove(&job)
        {
            for c in e.connected.values() {
                c.cancel();
            }
        }
    }

    /// The job's peers changed (a new assignment epoch): admit only `peers`
    /// from now on, and close the connections of peers that are no longer
    /// part of the job (fencing).
    pub fn update_peers(&self, job: JobId, me: PeerId, peers: impl IntoIterator<Item = PeerId>) {
        let mut jobs = self.lock();
        let Some(e) = jobs.get_mut(&job) else { return };
        e.peers = peers.into_iter().filter(|p| *p != me).collect();
        let peers = &e.peers;
        e.connected.retain(|p, c| {
            let keep = peers.contains(p);
            if !keep {
                c.cancel();
            }
            keep
        });
    }

    /// Close the connection `from` has to us for `job`, as a network fault
    /// would (it reconnects). Returns whether there was one.
    #[cfg(test)]
    pub fn cut(&self, job: JobId, from: PeerId) -> bool {
        let jobs = self.lock();
        match jobs.get(&job).and_then(|e| e.connected.get(&from)) {
            Some(c) => {
                c.cancel();
                true
            }
            None => false,
        }
    }

    pub(super) fn disconnected(&self, job: JobId, from: PeerId) {
        let mut jobs = self.lock();
        if let Some(e) = jobs.get_mut(&job)
            && e.connected.get(&from).is_some_and(|c| c.is_cancelled())
        {
            e.connected.remove(&from);
        }
    }

    /// The key of `job`'s connections.
    pub(super) fn key(&self, job: JobId) -> Result<JobKey, (RejectReason, String)> {
        match self.lock().get(&job) {
            Some(e) => Ok(e.key.clone()),
            None => Err(unknown_job(job)),
        }
    }

    /// Whether `from` may connect for `job`.
    pub(super) fn check(&self, job: JobId, from: PeerId) -> Result<(), (RejectReason, String)> {
        let jobs = self.lock();
        let e = jobs.get(&job).ok_or_else(|| unknown_job(job))?;
        Self::member(e, job, from)
    }

    pub(super) fn member(
        e: &Entry,
        job: JobId,
        from: PeerId,
    ) -> Result<(), (RejectReason, String)> {
        if from == e.me || !e.peers.contains(&from) {
            return Err((
                RejectReason::NotAuthorized,
                format!("peer #{from} is not one of the other peers of job {job}"),
            ));
        }
        Ok(())
    }

    /// Admit `from`'s connection for `job`, whose handshake and key
    /// confirmation succeeded.
    pub(super) fn admit(
        &self,
        job: JobId,
        from: PeerId,
    ) -> Result<(mpsc::Sender<Inbound>, CancellationToken), (RejectReason, String)> {
        let mut jobs = self.lock();
        let e = jobs.get_mut(&job).ok_or_else(|| unknown_job(job))?;
        Self::member(e, job, from)?;
        // A peer reconnects when its connection broke; the old one, if it is
        // still half open, is closed.
        let conn = CancellationToken::new();
        if let Some(old) = e.connected.insert(from, conn.clone()) {
            old.cancel();
        }
        Ok((e.tx.clone(), conn))
    }
}

pub(super) fn unknown_job(job: JobId) -> (RejectReason, String) {
    (
        RejectReason::UnknownJob,
        format!("this peer has no assignment for job {job} (yet); retry later"),
    )
}
