//! The supernode's error type and its mapping to [`ApiError`] answers.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bsp_api::rest::ApiError;

/// What went wrong in a supernode operation.
///
/// Every variant but [`Error::Database`] and [`Error::Internal`] carries a
/// message meant for the person who made the request; those two are logged
/// in full and answered with a generic 500 that reveals nothing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed (400).
    #[error("{message}")]
    BadRequest {
        /// Machine-readable code, e.g. `bad_request`, `bad_json`.
        code: &'static str,
        /// What was wrong.
        message: String,
    },
    /// No credentials, bad credentials, or an expired token or lease (401).
    #[error("{message}")]
    Unauthorized {
        /// `unauthorized`, `token_expired`, `account_disabled`,
        /// `wrong_password` or `lease_expired`.
        code: &'static str,
        /// What was wrong.
        message: String,
    },
    /// Authenticated, but not allowed (403).
    #[error("{0}")]
    Forbidden(String),
    /// The thing does not exist, or is not visible to the caller (404).
    #[error("{0}")]
    NotFound(String),
    /// The program a request names does not exist for the caller (404,
    /// code `program_not_found`).
    #[error("{0}")]
    ProgramNotFound(String),
    /// The thing exists already, or is in the wrong state (409).
    #[error("{0}")]
    Conflict(String),
    /// The request body or a part of it is too large (413).
    #[error("{0}")]
    TooLarge(String),
    /// The request is well-formed but its content is refused (422).
    #[error("{message}")]
    Unprocessable {
        /// Machine-readable code, e.g. `invalid_module`.
        code: &'static str,
        /// What was wrong.
        message: String,
    },
    /// Fewer peers are online than the job's `min_peers` (409, code
    /// `not_enough_peers`): the state of the network conflicts with the
    /// request. Not a 503: the supernode itself is fine.
    #[error("{0}")]
    NotEnoughPeers(String),
    /// The job needs more memory than the online peers may use together
    /// (409, code `not_enough_memory`).
    #[error("{0}")]
    NotEnoughMemory(String),
    /// The caller's quota does not allow it (409, code `quota_exceeded`).
    #[error("{0}")]
    QuotaExceeded(String),
    /// The database (SQLite or PostgreSQL) failed.
    #[error("database error: {0}")]
    Database(#[from] crate::sql::Error),
    /// Anything else that is the supernode's fault.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Whether a database error means the storage cannot take writes (SQLite's
/// disk full or failing; PostgreSQL unreachable, shutting down or out of
/// space), as opposed to a bug or a bad request: the supernode degrades
/// (issue 20, finding 4) instead of failing what depends on the write.
pub(crate) fn is_storage_error(e: &crate::sql::Error) -> bool {
    use rusqlite::ErrorCode as C;
    match e {
        crate::sql::Error::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => {
            matches!(f.code, C::DiskFull | C::SystemIoFailure | C::CannotOpen)
        }
        crate::sql::Error::Postgres(e) => crate::sql::is_unavailable(e),
        _ => false,
    }
}

/// The message of a 503 while the disk takes no writes.
pub(crate) const STORAGE_MESSAGE: &str = "the supernode cannot write to its disk (it is full, or failing): nothing new is stored until space returns, but running jobs go on and their output waits on the peers; try again later";

impl Error {
    /// Whether this is a SQLite error of a disk that takes no writes.
    pub fn is_storage(&self) -> bool {
        matches!(self, Error::Database(e) if is_storage_error(e))
    }

    /// A 400 with code `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Error {
        Error::BadRequest {
            code: "bad_request",
            message: message.into(),
        }
    }

    /// A 401 with code `unauthorized`.
    pub fn unauthorized(message: impl Into<String>) -> Error {
        Error::Unauthorized {
            code: "unauthorized",
            message: message.into(),
        }
    }

    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Error::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Error::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            Error::Forbidden(_) => StatusCode::FORBIDDEN,
            Error::NotFound(_) | Error::ProgramNotFound(_) => StatusCode::NOT_FOUND,
            Error::NotEnoughPeers(_) | Error::NotEnoughMemory(_) => StatusCode::CONFLICT,
            Error::Conflict(_) | Error::QuotaExceeded(_) => StatusCode::CONFLICT,
            Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Unprocessable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Error::Database(e) if is_storage_error(e) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Database(_) | Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The body this error is answered with.
    pub fn to_api_error(&self) -> ApiError {
        let (code, message) = match self {
            Error::BadRequest { code, message }
            | Error::Unauthorized { code, message }
            | Error::Unprocessable { code, message } => (*code, message.clone()),
            Error::NotEnoughPeers(m) => ("not_enough_peers", m.clone()),
            Error::NotEnoughMemory(m) => ("not_enough_memory", m.clone()),
            Error::ProgramNotFound(m) => ("program_not_found", m.clone()),
            Error::Forbidden(m) => ("forbidden", m.clone()),
            Error::NotFound(m) => ("not_found", m.clone()),
            Error::Conflict(m) => ("conflict", m.clone()),
            Error::QuotaExceeded(m) => ("quota_exceeded", m.clone()),
            Error::TooLarge(m) => ("too_large", m.clone()),
            Error::Database(e) if is_storage_error(e) => {
                ("storage_unavailable", STORAGE_MESSAGE.to_string())
            }
            Error::Database(_) | Error::Internal(_) => (
                "internal",
                "internal error in the supernode; its log has the details".to_string(),
            ),
        };
        ApiError {
            code: code.to_string(),
            message,
        }
    }
}

/// An [`ApiError`] answer with a status.
pub(crate) fn api_error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(ApiError {
            code: code.to_string(),
            message: message.into(),
        }),
    )
        .into_response()
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        if matches!(self, Error::Database(_) | Error::Internal(_)) && !self.is_storage() {
            tracing::error!(error = %self, "request failed");
        }
        let status = self.status();
        (status, axum::Json(self.to_api_error())).into_response()
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Error {
        Error::Internal(format!("background task failed: {e}"))
    }
}
