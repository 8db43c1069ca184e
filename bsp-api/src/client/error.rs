//! [`ClientError`]: what went wrong talking to a supernode, typed by cause.

use crate::rest::ApiError;

/// What went wrong talking to a supernode.
///
/// The causes an application usually handles on its own each have a
/// variant: those of dissertation Listing 2.2 (no supernode connection,
/// authentication failed, program not found, not enough peers), a module
/// the supernode refuses, and a supernode URL this client cannot use. Every
/// other error answer of the supernode is [`ClientError::Api`].
///
/// [`is_transient`](ClientError::is_transient) tells the errors worth
/// retrying as they are from those that need a change first.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The supernode could not be reached, or the connection broke: nothing
    /// listens at the URL, the network is down, the answer was cut off, or
    /// none came within the request timeout
    /// ([`Client::with_request_timeout`](super::Client::with_request_timeout);
    /// `source.is_timeout()` tells).
    #[error("cannot reach the supernode at {url}: {source}")]
    NotConnected {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The TLS connection to an `https://` supernode failed: its
    /// certificate is not the pinned one, not signed by a trusted CA, or
    /// not valid for the URL's host, or the handshake failed. `reason` says
    /// what to do. Nothing was sent. Retrying as it is does not help.
    #[error("cannot connect securely to the supernode at {url}: {reason}")]
    Tls { url: String, reason: String },
    /// The supernode URL given to [`Client::login`](super::Client::login) or
    /// [`Client::with_token`](super::Client::with_token) is not one this
    /// client can use; `reason` says how to fix it. Retrying does not help.
    #[error("invalid supernode URL `{url}`: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// HTTP 401: wrong user name or password, or a missing, forged or
    /// expired token (`code` is `unauthorized` or `token_expired`). Log in
    /// again.
    #[error("not authorized: {message} ({code})")]
    Unauthorized { code: String, message: String },
    /// The job asked for more online peers than there are
    /// ([`SubmitJob::min_peers`](crate::rest::SubmitJob::min_peers)); HTTP 409
    /// `not_enough_peers`. Try again later or ask for fewer.
    #[error("not enough peers: {message}")]
    NotEnoughPeers { message: String },
    /// No program of that name or hash is visible to the user; HTTP 404
    /// `program_not_found`. Upload it first.
    #[error("program not found: {message}")]
    ProgramNotFound { message: String },
    /// The uploaded bytes are not a module bspweb can run (not WebAssembly,
    /// or imports or exports the ABI does not allow); HTTP 422
    /// `invalid_module`. The message names what is wrong.
    #[error("invalid program: {message}")]
    InvalidProgram { message: String },
    /// Any other error answer of the supernode.
    #[error("{message} ({status} {code})")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// The job's arguments cannot be encoded as JSON.
    #[error("cannot encode the job's arguments as JSON: {0}")]
    Args(#[from] serde_json::Error),
    /// The answer was not what the API promises.
    #[error("unexpected answer from the supernode: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The HTTP status of an error answer of the supernode (every variant
    /// but [`NotConnected`](ClientError::NotConnected),
    /// [`InvalidUrl`](ClientError::InvalidUrl), [`Args`](ClientError::Args)
    /// and [`Protocol`](ClientError::Protocol)).
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Unauthorized { .. } => Some(401),
            ClientError::NotEnoughPeers { .. } => Some(409),
            ClientError::ProgramNotFound { .. } => Some(404),
            ClientError::InvalidProgram { .. } => Some(422),
            ClientError::Api { status, .. } => Some(*status),
            ClientError::NotConnected { .. }
            | ClientError::Tls { .. }
            | ClientError::InvalidUrl { .. }
            | ClientError::Args(_)
            | ClientError::Protocol(_) => None,
        }
    }

    /// The machine-readable [`ApiError::code`] of an error answer.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Unauthorized { code, .. } | ClientError::Api { code, .. } => Some(code),
            ClientError::NotEnoughPeers { .. } => Some(NOT_ENOUGH_PEERS),
            ClientError::ProgramNotFound { .. } => Some(PROGRAM_NOT_FOUND),
            ClientError::InvalidProgram { .. } => Some(INVALID_MODULE),
            ClientError::NotConnected { .. }
            | ClientError::Tls { .. }
            | ClientError::InvalidUrl { .. }
            | ClientError::Args(_)
            | ClientError::Protocol(_) => None,
        }
    }

    /// True when the supernode could not be reached (the request may be
    /// retried later as it is).
    pub fn is_not_connected(&self) -> bool {
        matches!(self, ClientError::NotConnected { .. })
    }

    /// True when the same request may well succeed later as it is: the
    /// supernode could not be reached or did not answer in time
    /// ([`NotConnected`](ClientError::NotConnected)), or it answered 408,
    /// 429 or 5xx (busy, restarting, or behind a proxy that lost it). The
    /// event streams retry these by themselves; every other error needs a
    /// change first (log in again, fix the request).
    pub fn is_transient(&self) -> bool {
        self.is_not_connected() || matches!(self.status(), Some(408 | 429 | 500..=599))
    }

    /// A failed request: [`Tls`](ClientError::Tls) when TLS refused the
    /// supernode, [`NotConnected`](ClientError::NotConnected) otherwise.
    pub(crate) fn transport(url: &str, source: reqwest::Error) -> ClientError {
        if let Some(reason) = super::tls::tls_failure(&source) {
            return ClientError::Tls {
                url: url.to_string(),
                reason,
            };
        }
        ClientError::NotConnected {
            url: url.to_string(),
            source,
        }
    }
}

const NOT_ENOUGH_PEERS: &str = "not_enough_peers";
const PROGRAM_NOT_FOUND: &str = "program_not_found";
const INVALID_MODULE: &str = "invalid_module";

/// The typed error for an error answer with `status` and `body`.
pub(crate) fn api_error(status: u16, body: &[u8]) -> ClientError {
    let (code, message) = match serde_json::from_slice::<ApiError>(body) {
        Ok(e) => (e.code, e.message),
        Err(_) => (
            "http".to_string(),
            String::from_utf8_lossy(body).chars().take(500).collect(),
        ),
    };
    match (status, code.as_str()) {
        (401, _) => ClientError::Unauthorized { code, message },
        (_, NOT_ENOUGH_PEERS) => ClientError::NotEnoughPeers { message },
        (_, PROGRAM_NOT_FOUND) => ClientError::ProgramNotFound { message },
        (_, INVALID_MODULE) => ClientError::InvalidProgram { message },
        _ => ClientError::Api {
            status,
            code,
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, code: &str) -> ClientError {
        let body = serde_json::to_vec(&ApiError {
            code: code.into(),
            message: "m".into(),
        })
        .unwrap();
        api_error(status, &body)
    }

    #[test]
    fn each_cause_of_listing_2_2_has_its_own_variant_and_keeps_its_status() {
        let cases = [
            (401, "unauthorized"),
            (401, "token_expired"),
            (409, "not_enough_peers"),
            (404, "program_not_found"),
            (422, "invalid_module"),
            (404, "not_found"),
            (409, "conflict"),
        ];
        for (status, code) in cases {
            let e = answer(status, code);
            let typed = match &e {
                ClientError::Unauthorized { .. } => "unauthorized",
                ClientError::NotEnoughPeers { .. } => "not_enough_peers",
                ClientError::ProgramNotFound { .. } => "program_not_found",
                ClientError::InvalidProgram { .. } => "invalid_module",
                ClientError::Api { .. } => "api",
                other => panic!("{other:?}"),
            };
            let want = match code {
                "token_expired" => "unauthorized",
                "not_found" | "conflict" => "api",
                c => c,
            };
            assert_eq!(typed, want, "{status} {code}");
            assert_eq!(e.status(), Some(status));
            assert_eq!(e.code(), Some(code));
        }
        let garbage = api_error(502, b"<html>bad gateway</html>");
        assert_eq!(garbage.status(), Some(502));
        assert!(garbage.to_string().contains("bad gateway"), "{garbage}");
    }

    #[test]
    fn only_unreachable_busy_and_server_side_failures_are_transient() {
        for status in [408, 429, 500, 502, 503, 504] {
            assert!(answer(status, "x").is_transient(), "{status}");
        }
        for (status, code) in [
            (400, "bad_request"),
            (401, "unauthorized"),
            (401, "token_expired"),
            (403, "forbidden"),
            (404, "not_found"),
            (409, "not_enough_peers"),
            (422, "invalid_module"),
        ] {
            assert!(!answer(status, code).is_transient(), "{status} {code}");
        }
        let url = ClientError::InvalidUrl {
            url: "x".into(),
            reason: "r".into(),
        };
        assert!(!url.is_transient() && url.status().is_none() && url.code().is_none());
        assert!(!ClientError::Protocol("p".into()).is_transient());
    }
}
