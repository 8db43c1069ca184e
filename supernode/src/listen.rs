//! The HTTP listener: hyper's HTTP/1 server under the axum router, with the
//! limits that keep one client from taking the supernode down (issue 20,
//! finding 3, "slowloris"):
//!
//! - **Header-read and idle timeout.** A request's headers must arrive
//!   within [`HttpLimits::header_timeout`]; the same timer closes a
//!   keep-alive connection idle that long between requests.
//! - **Body idle timeout.** A request body that sends nothing for
//!   [`HttpLimits::body_timeout`] ends the request with an error.
//! - **Connection limits.** At most [`HttpLimits::max_connections`] open
//!   connections: at the limit the listener stops accepting, so further
//!   clients wait in the kernel's backlog (back-pressure) instead of using
//!   up file descriptors; and at most
//!   [`HttpLimits::max_connections_per_address`] from one address, beyond
//!   which new connections are closed at once.
//!
//! Streams of events and long polls are responses being written, not
//! headers being read, so the timeouts do not end them.
//!
//! With TLS ([`crate::ServerTls`]) the handshake runs inside the
//! connection's slot and must finish within the header timeout, so a
//! client that stalls it holds its slot no longer than a slow request
//! would. A client that speaks plain HTTP to the TLS listener is answered
//! `400` in plain text, saying to use `https://`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tower::ServiceExt;
use tower_http::timeout::TimeoutBody;

/// The limits of the HTTP listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Open connections at most; at the limit, new ones wait to be accepted.
    pub max_connections: usize,
    /// Open connections from one IP address at most; more are closed.
    pub max_connections_per_address: usize,
    /// Time for a request's headers to arrive, and for an idle keep-alive
    /// connection to send its next request.
    pub header_timeout: Duration,
    /// Time a request body may send nothing.
    pub body_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 2048,
            max_connections_per_address: 256,
            header_timeout: Duration::from_secs(20),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// Open connections per remote address.
#[derive(Debug, Default)]
struct PerAddress(Mutex<HashMap<IpAddr, usize>>);

/// One counted connection; uncounted when dropped.
struct Counted {
    all: Arc<PerAddress>,
    ip: IpAddr,
}

impl PerAddress {
    fn enter(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<Counted> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Counted {
            all: self.clone(),
            ip,
        })
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut m = self.all.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// File descriptors the supernode keeps for itself (database, peers'
/// sockets it dials, logs) beyond the HTTP connections.
const RESERVED_FDS: u64 = 256;

/// Raise the soft limit of open files to the hard limit (at most 1 << 20)
/// and return it: Debian's default soft limit of 1024 would otherwise be
/// the real connection limit.
fn raise_open_file_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid pointer to a
    // local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    let want = lim.rlim_max.min(1 << 20);
    if lim.rlim_cur < want {
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads one `rlimit` through a valid pointer to
        // a local; a refusal leaves the limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some(want);
        }
    }
    Some(lim.rlim_cur)
}

/// `limits` with the connection limit lowered to what the open-file limit
/// allows, saying so.
fn within_open_file_limit(mut limits: HttpLimits) -> HttpLimits {
    let Some(files) = raise_open_file_limit() else {
        return limits;
    };
    let fit = usize::try_from(files.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
    if limits.max_connections > fit {
        tracing::warn!(
            open_file_limit = files,
            "HTTP: allowing {fit} connections instead of {}, to stay within the open-file limit (raise it with `ulimit -n` or LimitNOFILE=)",
            limits.max_connections
        );
        limits.max_connections = fit.max(16);
    }
    limits
}

/// Serve `app` on `listener` within `limits` until `stop` turns true; then
/// stop accepting, let every connection finish its current response
/// (hyper's graceful shutdown) and return once all are closed.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    mut stop: watch::Receiver<bool>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> std::io::Result<()> {
    let limits = within_open_file_limit(limits);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let per_address = Arc::new(PerAddress::default());
    let tracker = tokio_util::task::TaskTracker::new();
    let mut warned_full = false;
    let mut warned_address = None;
    loop {
        // A free slot first: at the limit, clients wait in the backlog.
        let slot = if slots.available_permits() == 0 {
            if !warned_full {
                tracing::warn!(
                    limit = limits.max_connections,
                    "HTTP: the connection limit is reached; new connections wait until one closes"
                );
                warned_full = true;
            }
            tokio::select! {
                _ = stopped(&mut stop) => break,
                slot = slots.clone().acquire_owned() => slot,
            }
        } else {
            slots.clone().acquire_owned().await
        };
        let Ok(slot) = slot else { break };
        let (stream, addr) = tokio::select! {
            _ = stopped(&mut stop) => break,
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly.
                    tracing::warn!("HTTP: cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if slots.available_permits() > limits.max_connections / 2 {
            warned_full = false;
        }
        let key = bsp_api::connection_key(addr.ip());
        let Some(counted) = per_address.enter(key, limits.max_connections_per_address) else {
            if warned_address != Some(key) {
                tracing::warn!(
                    address = %key,
                    limit = limits.max_connections_per_address,
                    "HTTP: too many connections from one address; closing new ones"
                );
                warned_address = Some(key);
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let body_timeout = limits.body_timeout;
        let service = app
            .clone()
            .map_request(move |req: hyper::Request<Incoming>| {
                req.map(|b| Body::new(TimeoutBody::new(body_timeout, b)))
            });
        let service = TowerToHyperService::new(service);
        let mut stop = stop.clone();
        let header_timeout = limits.header_timeout;
        let tls = tls.clone();
        tracker.spawn(async move {
            let _slot = slot;
            let _counted = counted;
            let stream: Box<dyn Io> = match tls {
                None => Box::new(stream),
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(header_timeout, accept(acceptor, stream));
                    tokio::select! {
                        _ = stopped(&mut stop) => return,
                        done = handshake => match done {
                            Ok(Some(s)) => s,
                            Ok(None) => return,
                            Err(_) => {
                                tracing::debug!("HTTP: the TLS handshake with {addr} timed out");
                                return;
                            }
                        },
                    }
                }
            };
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true);
            let conn = http.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            let stopping = stopped(&mut stop);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!("HTTP: connection from {addr} ended: {e}");
                    }
                    return;
                }
                _ = stopping => conn.as_mut().graceful_shutdown(),
            }
            if let Err(e) = conn.await {
                tracing::debug!("HTTP: connection from {addr} ended: {e}");
            }
        });
    }
    drop(listener);
    tracker.close();
    tracker.wait().await;
    Ok(())
}

/// A connection's byte stream, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The first byte of a TLS record carrying a handshake message.
const TLS_HANDSHAKE: u8 = 0x16;

/// The TLS handshake on `stream`; `None` if it failed (logged), or if the
/// client spoke plain HTTP, which is answered saying to use `https://`.
async fn accept(acceptor: tokio_rustls::TlsAcceptor, mut stream: TcpStream) -> Option<Box<dyn Io>> {
    let addr = stream.peer_addr().ok();
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(1) if first[0] != TLS_HANDSHAKE => {
            if first[0].is_ascii_uppercase() {
                let body = "this bspweb supernode serves HTTPS only: use its https:// URL\n";
                let answer = format!(
                    "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            }
            return None;
        }
        Ok(1) => {}
        _ => return None,
    }
    match acceptor.accept(stream).await {
        Ok(s) => Some(Box::new(s)),
        Err(e) => {
            tracing::debug!("HTTP: the TLS handshake with {addr:?} failed: {e}");
            None
        }
    }
}

/// Until `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}
