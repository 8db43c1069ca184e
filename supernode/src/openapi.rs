//! The OpenAPI 3.1 document of the REST API, generated from the handlers'
//! `#[utoipa::path]` attributes and the `bsp-api` types (feature `openapi`).
//! Served at `/api/v1/openapi.json`; `/api/docs` renders it for people.

use std::sync::OnceLock;

use axum::Json;
use utoipa::Modify;
use utoipa::openapi::OpenApi as Document;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

/// The document's root: title, version, security schemes and tags. The
/// paths come from the router (`http::api_router`).
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "bspweb",
        description = "Run bulk-synchronous parallel programs, compiled to WebAssembly, on \
computers volunteers donate. Users log in (`POST /api/v1/login`) and send the token as \
`Authorization: Bearer <token>`; peers get a lease token from `POST /api/v1/peer/login`. \
Every error answer is an `ApiError` body: a machine-readable `code` and a `message` for people. \
Beyond the operations listed here, a path the API does not have answers `404 not_found`, a method \
a path does not list answers `405 method_not_allowed` with an `Allow` header, and `HEAD` is \
answered like `GET` without the body.",
        license(name = "MIT OR Apache-2.0")
    ),
    modifiers(&Security),
    tags(
        (name = "users", description = "Logging in and user accounts"),
        (name = "programs", description = "WebAssembly modules users can run"),
        (name = "jobs", description = "Submitting, following, killing and disposing of jobs"),
        (name = "peers", description = "The volunteer peers and the placement ring"),
        (name = "peer control plane", description = "What peers call; not for users"),
        (name = "meta", description = "Health and this document"),
    )
)]
pub(crate) struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut Document) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "user",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some("A user token from POST /api/v1/login"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "peer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some("A peer's lease token from POST /api/v1/peer/login"))
                    .build(),
            ),
        );
    }
}

/// The document, built once.
pub(crate) fn document() -> &'static Document {
    static DOC: OnceLock<Document> = OnceLock::new();
    DOC.get_or_init(crate::http::openapi)
}

/// `GET /api/v1/openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    summary = "This OpenAPI 3.1 document",
    responses((status = 200, description = "The document", content_type = "application/json"))
)]
pub(crate) async fn openapi_json() -> Json<&'static Document> {
    Json(document())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation of the document, as `(method, path, operation JSON)`.
    fn operations() -> Vec<(String, String, serde_json::Value)> {
        let doc = serde_json::to_value(document()).unwrap();
        let mut out = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                out.push((method.clone(), path.clone(), op.clone()));
            }
        }
        out
    }

    #[test]
    fn the_document_is_openapi_3_1_with_every_api_route() {
        let doc = serde_json::to_value(document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut ops: Vec<String> = operations()
            .iter()
            .map(|(m, p, _)| format!("{m} {p}"))
            .collect();
        ops.sort();
        let expected = [
            "delete /api/v1/enrollments/{id}",
            "delete /api/v1/jobs/{id}",
            "delete /api/v1/programs/{program}",
            "get /api/v1/enrollments",
            "get /api/v1/events",
            "get /api/v1/health",
            "get /api/v1/jobs",
            "get /api/v1/jobs/{id}",
            "get /api/v1/jobs/{id}/events",
            "get /api/v1/me",
            "get /api/v1/openapi.json",
            "get /api/v1/peer/commands",
            "get /api/v1/peer/jobs/{job}/resources",
            "get /api/v1/peer/modules/{hash}",
            "get /api/v1/peers",
            "get /api/v1/programs",
            "get /api/v1/ring",
            "get /api/v1/users",
            "patch /api/v1/peers/{id}",
            "patch /api/v1/users/{user}",
            "post /api/v1/enrollments",
            "post /api/v1/jobs",
            "post /api/v1/jobs/{id}/kill",
            "post /api/v1/login",
            "post /api/v1/me/password",
            "post /api/v1/peer/drain",
            "post /api/v1/peer/login",
            "post /api/v1/peer/renew",
            "post /api/v1/peer/report",
            "post /api/v1/peer/resume",
            "post /api/v1/programs",
            "post /api/v1/users",
            "post /api/v1/users/{user}/password",
        ];
        assert_eq!(ops, expected);
        // The header a `follow=false` event stream answers with.
        let events = &doc["paths"]["/api/v1/jobs/{id}/events"]["get"];
        assert!(
            events["responses"]["200"]["headers"]["bspweb-last-event-id"].is_object(),
            "{events}"
        );
        assert_eq!(
            crate::sse::LAST_STORED_EVENT,
            "bspweb-last-event-id",
            "the documented header name"
        );
    }

    /// The document is generated from the router, so a route is documented
    /// exactly when it is added with `routes!` (which takes the handler's
    /// `#[utoipa::path]`). A plain `.route(..)`, `.nest(..)` or `.merge(..)`
    /// in the API router would serve an undocumented route: refuse it here.
    #[test]
    fn the_api_router_adds_routes_only_with_their_documentation() {
        let source = include_str!("http.rs");
        let start = source.find("fn api_v1()").expect("http.rs has api_v1");
        let body = &source[start..];
        let body = &body[..body.find("\n}\n").expect("api_v1 ends")];
        let calls: Vec<&str> = body
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with('.'))
            .collect();
        assert!(calls.len() >= 20, "{calls:?}");
        for call in calls {
            assert!(
                call.starts_with(".routes(routes!("),
                "api_v1 adds a route without its OpenAPI description: {call}"
            );
        }
        for undocumented in [
            ".route(",
            ".route_service(",
            ".nest",
            ".merge(",
            ".fallback",
        ] {
            assert!(
                !body.contains(undocumented),
                "api_v1 must add routes only with routes!: it calls {undocumented}"
            );
        }
        assert_eq!(
            body.matches(".routes(").count(),
            body.matches(".routes(routes!(").count()
        );
        // The whole router: the web UI's routes merged with the API router.
        let whole = &source[source.find("pub(crate) fn router(").expect("router")..];
        let whole = &whole[..whole.find("\n}\n").unwrap()];
        // Besides the API, only `/metrics` (Prometheus's path, not JSON).
        let whole = whole.replacen(".route(\"/metrics\"", "", 1);
        assert!(
            !whole.contains(".route(")
                && !whole.contains(".nest")
                && whole.matches(".merge(").count() == 1,
            "router adds routes beside the documented API router: {whole}"
        );
        let ui = &source[source.find("fn ui_routes(").expect("ui_routes")..];
        let ui = &ui[..ui.find("\n}\n").unwrap()];
        assert!(
            ui.contains("in UI_FILES") && ui.matches(".route(").count() == 1,
            "{ui}"
        );
        // The web UI's files are the only other routes, and none is an API path.
        for (path, _, _) in crate::http::UI_FILES {
            assert!(!path.starts_with("/api/v1"), "{path}");
        }
        let root = &source[source.find("fn api_router()").expect("api_router")..];
        let root = &root[..root.find("\n}\n").unwrap()];
        assert!(
            root.contains(".nest(\"/api/v1\", api_v1())") && root.matches('.').count() <= 4,
            "api_router must be exactly the documented api_v1: {root}"
        );
    }

    #[test]
    fn every_operation_documents_the_errors_its_extractors_can_give() {
        for (method, path, op) in operations() {
            let responses = op["responses"].as_object().unwrap();
            let has = |s: &str| responses.contains_key(s);
            let what = format!("{method} {path}");
            assert!(has("200") || has("204"), "{what}: no success answer");
            for param in path.split('{').skip(1) {
                let name = param.split('}').next().unwrap();
                let declared = op["parameters"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["name"] == name && p["in"] == "path"));
                assert!(declared, "{what}: path parameter {name} undeclared");
                assert!(has("400"), "{what}: a bad path parameter is a 400");
            }
            if op.get("security").is_some() {
                assert!(has("401"), "{what}: authenticated but no 401");
            }
            if op.get("requestBody").is_some() {
                for s in ["400", "413"] {
                    assert!(has(s), "{what}: takes a body but does not document {s}");
                }
            }
            if op["requestBody"]["content"]
                .get("application/json")
                .is_some()
            {
                assert!(
                    has("422"),
                    "{what}: a JSON body of the wrong shape is a 422"
                );
            }
            for (status, r) in responses {
                if status != "200" && status != "204" {
                    let schema = &r["content"]["application/json"]["schema"]["$ref"];
                    assert_eq!(
                        schema, "#/components/schemas/ApiError",
                        "{what}: error {status} without an ApiError body"
                    );
                }
            }
        }
    }
}
