//! The router, body limits, and extractors whose rejections are [`ApiError`]s.
//!
//! [`ApiError`]: bsp_api::rest::ApiError

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::de::DeserializeOwned;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::{DefaultOnFailure, TraceLayer};
use utoipa::OpenApi;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

use crate::error::api_error;
use crate::{Error, Supernode, control, enrollments, rest, sse};

/// Body limit for program uploads and job submissions.
pub(crate) const LARGE_BODY: usize = 64 << 20;
/// Body limit for peer reports.
pub(crate) const REPORT_BODY: usize = 8 << 20;
/// Body limit for everything else.
pub(crate) const SMALL_BODY: usize = 1 << 20;

/// The web UI: static files embedded in the binary, no build step, nothing
/// fetched from elsewhere at run time.
pub(crate) const UI_FILES: &[(&str, &str, &str)] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("../../web-ui/index.html"),
    ),
    (
        "/index.html",
        "text/html; charset=utf-8",
        include_str!("../../web-ui/index.html"),
    ),
    (
        "/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web-ui/app.js"),
    ),
    (
        "/app.css",
        "text/css; charset=utf-8",
        include_str!("../../web-ui/app.css"),
    ),
    (
        "/api/docs",
        "text/html; charset=utf-8",
        include_str!("../../web-ui/api-docs.html"),
    ),
];

fn ui_routes(mut router: Router<Supernode>) -> Router<Supernode> {
    use axum::http::HeaderValue;
    for &(path, content_type, body) in UI_FILES {
        let csp = HeaderValue::from_str(&ui_content_security_policy(body))
            .expect("the Content-Security-Policy is ASCII");
        router = router.route(
            path,
            get(move || async move {
                (
                    [
                        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
                        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
                        (header::CONTENT_SECURITY_POLICY, csp),
                        (
                            header::X_CONTENT_TYPE_OPTIONS,
                            HeaderValue::from_static("nosniff"),
                        ),
                        (
                            header::REFERRER_POLICY,
                            HeaderValue::from_static("no-referrer"),
                        ),
                    ],
                    body,
                )
            }),
        );
    }
    router
}

/// The Content-Security-Policy of a UI file: everything from the supernode
/// itself, nothing from elsewhere, no framing, and no inline code except the
/// plain `<script>` and `<style>` blocks of `body` itself, allowed by their
/// SHA-256 (so editing such a block needs no edit here). Images may also be
/// `blob:` (pictures from raw output) and `data:` (the empty favicon).
fn ui_content_security_policy(body: &str) -> String {
    use base64::Engine;
    use sha2::{Digest, Sha256};
    let hashes = |tag: &str| {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        let mut out = String::new();
        let mut rest = body;
        while let Some(start) = rest.find(&open) {
            let inner = &rest[start + open.len()..];
            let Some(end) = inner.find(&close) else {
                break;
            };
            let digest = Sha256::digest(&inner.as_bytes()[..end]);
            out.push_str(&format!(
                " 'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(digest)
            ));
            rest = &inner[end + close.len()..];
        }
        out
    };
    format!(
        "default-src 'self'; script-src 'self'{}; style-src 'self'{}; \
         img-src 'self' blob: data:; connect-src 'self'; object-src 'none'; \
         base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        hashes("script"),
        hashes("style"),
    )
}

/// The REST API under `/api/v1`: every route comes with its OpenAPI
/// description (`#[utoipa::path]` on its handler), so none is undocumented.
fn api_router() -> OpenApiRouter<Supernode> {
    OpenApiRouter::with_openapi(crate::openapi::ApiDoc::openapi()).nest("/api/v1", api_v1())
}

fn api_v1() -> OpenApiRouter<Supernode> {
    OpenApiRouter::new()
        .routes(routes!(crate::openapi::openapi_json))
        .routes(routes!(rest::login))
        .routes(routes!(rest::create_user, rest::users))
        .routes(routes!(rest::update_user))
        .routes(routes!(rest::set_password))
        .routes(routes!(rest::me))
        .routes(routes!(rest::change_password))
        .routes(routes!(rest::upload_program).layer(DefaultBodyLimit::max(LARGE_BODY)))
        .routes(routes!(rest::programs))
        .routes(routes!(rest::delete_program))
        .routes(routes!(rest::submit).layer(DefaultBodyLimit::max(LARGE_BODY)))
        .routes(routes!(rest::jobs))
        .routes(routes!(rest::job, rest::dispose))
        .routes(routes!(rest::kill))
        .routes(routes!(sse::events))
        .routes(routes!(sse::job_list_events))
        .routes(routes!(rest::peers))
        .routes(routes!(enrollments::update_peer))
        .routes(routes!(enrollments::create, enrollments::list))
        .routes(routes!(enrollments::revoke))
        .routes(routes!(rest::ring))
        .routes(routes!(rest::health))
        .routes(routes!(control::login))
        .routes(routes!(control::renew))
        .routes(routes!(control::commands))
        .routes(routes!(control::report).layer(DefaultBodyLimit::max(REPORT_BODY)))
        .routes(routes!(control::drain))
        .routes(routes!(control::resume))
        .routes(routes!(control::module))
        .routes(routes!(control::resources))
}

/// The OpenAPI 3.1 document of the REST API, as served at
/// `/api/v1/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_router().into_openapi()
}

pub(crate) fn router(sn: Supernode) -> Router {
    let api = Router::from(api_router());
    let mut router = ui_routes(Router::new());
    if sn.inner.config.metrics {
        router = router.route("/metrics", axum::routing::get(rest::metrics));
    }
    router
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(SMALL_BODY))
        .with_state(sn)
        // Failed requests are logged where they fail (`Error::into_response`
        // for internal errors, once for a disk that takes no writes), not
        // again for every 5xx answer.
        .layer(
            TraceLayer::new_for_http()
                .on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG)),
        )
        .layer(CatchPanicLayer::custom(on_panic))
}

async fn not_found() -> Response {
    api_error(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; the API lives under /api/v1",
    )
}

async fn method_not_allowed() -> Response {
    api_error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this endpoint does not accept that HTTP method",
    )
}

fn on_panic(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    tracing::error!("a request handler panicked");
    api_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal error in the supernode; its log has the details",
    )
}

/// A JSON body. Does not insist on a content type; malformed JSON is a 400
/// `bad_json`, well-formed JSON of the wrong shape a 422 `invalid_body`.
pub(crate) struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        let ApiBytes(bytes) = ApiBytes::from_request(req, state).await?;
        match serde_json::from_slice(&bytes) {
            Ok(v) => Ok(ApiJson(v)),
            Err(e) if e.is_data() => Err(Error::Unprocessable {
                code: "invalid_body",
                message: format!("the request body does not have the expected fields: {e}"),
            }),
            Err(e) => Err(Error::BadRequest {
                code: "bad_json",
                message: format!("the request body is not valid JSON: {e}"),
            }),
        }
    }
}

/// A raw body within the route's limit; too large is a 413 `too_large`.
pub(crate) struct ApiBytes(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBytes {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        match Bytes::from_request(req, state).await {
            Ok(b) => Ok(ApiBytes(b)),
            Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(Error::TooLarge(
                "the request body is larger than this endpoint accepts".into(),
            )),
            Err(r) => Err(Error::bad_request(format!(
                "cannot read the request body: {}",
                r.body_text()
            ))),
        }
    }
}

/// Query parameters; a bad one is a 400.
pub(crate) struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|r| Error::bad_request(r.body_text()))
    }
}

/// A path parameter; a bad one (a job id that is not a number) is a 400.
pub(crate) struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|r| Error::bad_request(r.body_text()))
    }
}

/// `204 No Content`.
pub(crate) fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}
