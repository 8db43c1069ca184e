//! The data-plane listener ([`serve`]): admission of strangers' connections
//! (pending limits, the Noise handshake under the job's key, the key
//! confirmation), then each connection's frames to its job.

use super::*;

/// Connections accepted but not admitted yet, counted from everywhere and
/// per remote address (issue 20, finding 2).
#[derive(Debug, Default)]
pub(super) struct Pending {
    pub(super) counts: Mutex<(usize, HashMap<std::net::IpAddr, usize>)>,
}

/// One pending connection; counted until dropped.
pub(super) struct PendingSlot {
    pub(super) pending: Arc<Pending>,
    pub(super) ip: std::net::IpAddr,
}

impl Pending {
    pub(super) fn enter(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<PendingSlot> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let here = c.1.get(&ip).copied().unwrap_or(0);
        if c.0 >= MAX_PENDING || here >= MAX_PENDING_PER_ADDRESS {
            return None;
        }
        c.0 += 1;
        c.1.insert(ip, here + 1);
        Some(PendingSlot {
            pending: self.clone(),
            ip,
        })
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        let mut c = self
            .pending
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        c.0 = c.0.saturating_sub(1);
        if let Some(n) = c.1.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.1.remove(&self.ip);
            }
        }
    }
}

/// Accept data-plane connections until `shutdown` is cancelled.
/// At most one warning per [`WARN_EVERY`] about connections that fail
/// their handshake: strangers can open as many as they like, and each
/// would otherwise write a line to the volunteer's log. The next warning
/// says how many were left out.
pub(super) struct WarnThrottle {
    pub(super) state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

pub(super) const WARN_EVERY: Duration = Duration::from_secs(10);

pub(super) static HANDSHAKE_WARNINGS: WarnThrottle = WarnThrottle {
    state: std::sync::Mutex::new((None, 0)),
};

impl WarnThrottle {
    /// `Some(n)` when a warning may be written now (`n` were left out
    /// since the last one); `None` when this one is left out.
    pub(super) fn admit(&self) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        match st.0 {
            Some(last) if now.duration_since(last) < WARN_EVERY => {
                st.1 += 1;
                None
            }
            _ => {
                st.0 = Some(now);
                Some(std::mem::take(&mut st.1))
            }
        }
    }
}

/// Warn about a connection that failed its handshake, throttled.
pub(super) fn warn_handshake(what: std::fmt::Arguments<'_>) {
    match HANDSHAKE_WARNINGS.admit() {
        Some(0) => tracing::warn!("{what}"),
        Some(n) => tracing::warn!("{what} ({n} more such connections since the last warning)"),
        None => tracing::debug!("{what}"),
    }
}

pub async fn serve(listener: TcpListener, registry: Arc<Registry>, shutdown: CancellationToken) {
    let pending = Arc::new(Pending::default());
    let mut refused_logged = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, addr)) => {
                    let Some(slot) = pending.enter(bsp_api::connection_key(addr.ip())) else {
                        // Dropping the stream closes it before anything is read.
                        if !refused_logged {
                            tracing::warn!(
                                "data-plane listener: too many connections that have not said hello (from {addr} and others); closing new ones until they do"
                            );
                            refused_logged = true;
                        }
                        continue;
                    };
                    refused_logged = false;
                    let registry = registry.clone();
                    let shutdown = shutdown.clone();
                    tokio::spawn(async move {
                        handle_connection(stream, addr, slot, registry, shutdown).await;
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly.
                    tracing::warn!("data-plane listener: cannot accept a connection: {e}");
                    sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

pub(super) async fn reject(mut conn: FramedConn, reason: RejectReason, message: String) {
    tracing::debug!("data plane: rejecting a connection ({reason:?}): {message}");
    if let Ok(bytes) = encode(&Frame::Reject { reason, message }) {
        let _ = timeout(HANDSHAKE_TIMEOUT, async {
            let _ = conn.send(bytes).await;
            let _ = SinkExt::<Bytes>::close(&mut conn).await;
        })
        .await;
    }
}

pub(super) async fn handle_connection(
    stream: TcpStream,
    addr: SocketAddr,
    slot: PendingSlot,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let deadline = Instant::now() + HELLO_TIMEOUT;
    // Until the Hello is admitted, frames are at most MAX_HELLO_BYTES: a
    // longer length prefix ends the connection before its body is read.
    let mut conn = Framed::new(
        stream,
        LengthDelimitedCodec::builder()
            .max_frame_length(MAX_HELLO_BYTES)
            .new_codec(),
    );
    let first = match tokio::time::timeout_at(deadline, conn.next()).await {
        Ok(Some(Ok(bytes))) => decode(bytes),
        Ok(Some(Err(e))) => {
            tracing::debug!("data plane: connection from {addr} sent a bad first frame: {e}");
            return;
        }
        Ok(None) | Err(_) => return,
    };
    let (version, job, handshake) = match first {
        Ok(Frame::Hello {
            version,
            job,
            handshake,
        }) => (version, job, handshake),
        Ok(Frame::Probe(hello)) => {
            drop(slot);
            return registry.links.answer(conn, hello).await;
        }
        Ok(_) | Err(_) => {
            let msg = "the first frame on a data-plane connection must be Hello".to_string();
            return reject(conn, RejectReason::Protocol, msg).await;
        }
    };
    if version != WIRE_VERSION {
        let msg = format!(
            "data-plane protocol version {version} is not supported; this peer speaks version {WIRE_VERSION}"
        );
        return reject(conn, RejectReason::Version, msg).await;
    }
    let key = match registry.key(job) {
        Ok(k) => k,
        Err((reason, msg)) => return reject(conn, reason, msg).await,
    };
    let (responder, payload) = match Responder::accept(&key, version, job, &handshake) {
        Ok(x) => x,
        Err(e) => {
            warn_handshake(format_args!(
                "data plane: a connection from {addr} for job {job} failed the handshake ({e}); closing it"
            ));
            let msg = format!("the handshake did not decrypt under job {job}'s key");
            return reject(conn, RejectReason::NotAuthorized, msg).await;
        }
    };
    let Ok(HelloPayload { from, epoch: _ }) = postcard::from_bytes(&payload) else {
        let msg = "the hello's payload is malformed".to_string();
        return reject(conn, RejectReason::Protocol, msg).await;
    };
    // The answer, Welcome or Reject, is authenticated under the job's key.
    let verdict = registry.check(job, from);
    let answer = match &verdict {
        Ok(()) => Frame::Welcome,
        Err((reason, message)) => Frame::Reject {
            reason: *reason,
            message: message.clone(),
        },
    };
    let answered = encode(&answer)
        .map_err(|e| e.to_string())
        .and_then(|a| responder.answer(&a).map_err(|e| e.to_string()));
    let (transport, handshake) = match answered {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!("data plane: cannot answer {addr}'s hello for job {job}: {e}");
            return;
        }
    };
    let sent = tokio::time::timeout_at(deadline, async {
        let answer = encode(&Frame::Answer {
            handshake: handshake.into(),
        })
        .map_err(std::io::Error::other)?;
        conn.send(answer).await?;
        if verdict.is_err() {
            SinkExt::<Bytes>::close(&mut conn).await?;
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if let Err((reason, message)) = verdict {
        tracing::debug!("data plane: rejecting a connection ({reason:?}): {message}");
        return;
    }
    if !matches!(sent, Ok(Ok(()))) {
        return;
    }
    // Admit only once the dialer proves it holds the handshake's keys: a
    // replayed Hello gets this far, but can never replace a live connection.
    let parts = conn.into_parts();
    let mut secure = SecureStream::new(parts.io, transport, parts.read_buf);
    match tokio::time::timeout_at(deadline, secure.read_confirmation()).await {
        Ok(Ok(())) => {}
        // The dialer went away (its job ended, or it timed out) before it
        // confirmed: nothing wrong with the connection's bytes.
        Ok(Err(crate::noise::NoiseError::Truncated)) => {
            tracing::debug!(
                "data plane: peer #{from}'s connection from {addr} for job {job} closed before its key confirmation"
            );
            return;
        }
        Ok(Err(e)) => {
            warn_handshake(format_args!(
                "data plane: peer #{from}'s connection from {addr} for job {job} sent no valid key confirmation ({e}); closing it"
            ));
            return;
        }
        Err(_) => {
            warn_handshake(format_args!(
                "data plane: peer #{from}'s connection from {addr} for job {job} sent no key confirmation within {HELLO_TIMEOUT:?}; closing it"
            ));
            return;
        }
    }
    let mut conn = Framed::new(secure, codec());
    let (tx, this_conn) = match registry.admit(job, from) {
        Ok(x) => x,
        // Fenced out or unregistered while it confirmed.
        Err((reason, message)) => {
            if let Ok(b) = encode(&Frame::Reject { reason, message }) {
                let _ = timeout(HANDSHAKE_TIMEOUT, conn.send(b)).await;
            }
            return;
        }
    };
    drop(slot);
    if tx.send(Inbound::Connected { from }).await.is_err() {
        return;
    }
    let _forget = Forget {
        registry: &registry,
        job,
        from,
        conn: this_conn.clone(),
    };
    loop {
        let item = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tx.closed() => return say_job_ended(conn, job).await,
            _ = this_conn.cancelled() => {
                // Unregistered because the job's driver ended (it drops its
                // receiver first), or fenced out by a newer assignment.
                if tx.is_closed() {
                    say_job_ended(conn, job).await;
                }
                return;
            }
            item = conn.next() => item,
        };
        let event = match item {
            None => Inbound::Closed { from, error: None },
            Some(Err(e)) => Inbound::Closed {
                from,
                error: Some(e.to_string()),
            },
            Some(Ok(bytes)) => match decode(bytes) {
                Ok(frame) => Inbound::Frame { from, frame },
                Err(e) => Inbound::Closed {
                    from,
                    error: Some(format!("it sent a malformed frame ({e})")),
                },
            },
        };
        let closing = matches!(event, Inbound::Closed { .. });
        if tx.send(event).await.is_err() {
            if !closing {
                say_job_ended(conn, job).await;
            }
            return;
        }
        if closing {
            return;
        }
    }
}

/// Tell the sender on `conn` that `job` ended on this peer, so it does not
/// reconnect and re-send what nobody will read; then read (and drop) what
/// is still coming until it closes, because closing with unread bytes would
/// reset the connection and lose the notice.
pub(super) async fn say_job_ended(mut conn: SecureConn, job: JobId) {
    let ended = Frame::Reject {
        reason: RejectReason::JobEnded,
        message: format!("job {job} has ended on this peer"),
    };
    let Ok(bytes) = encode(&ended) else { return };
    let _ = timeout(HANDSHAKE_TIMEOUT, async {
        conn.send(bytes).await?;
        while conn.next().await.transpose()?.is_some() {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// Removes a connection from the registry when its reader ends.
pub(super) struct Forget<'a> {
    pub(super) registry: &'a Registry,
    pub(super) job: JobId,
    pub(super) from: PeerId,
    pub(super) conn: CancellationToken,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.conn.cancel();
        self.registry.disconnected(self.job, self.from);
    }
}
