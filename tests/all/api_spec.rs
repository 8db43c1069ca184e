//! The OpenAPI document served at `/api/v1/openapi.json` matches the routes
//! of the live supernode: every documented operation exists and answers
//! with a documented status, and no method that is not documented is
//! served on a documented path. (`scripts/api-fuzz` runs schemathesis
//! against the same document; the two never-ending event streams it skips
//! are checked here.)

use std::time::Duration;

use serde_json::Value;

use crate::harness::shared;

/// A value for a path parameter that names nothing that exists.
fn param_value(name: &str) -> &'static str {
    match name {
        "id" => "987654321",
        "hash" => "0000000000000000000000000000000000000000000000000000000000000000",
        _ => "no-such-thing",
    }
}

fn concrete(path: &str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').unwrap() + start;
        out.push_str(param_value(&rest[start + 1..end]));
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

fn is_router_fallback(status: u16, body: &Value) -> bool {
    (status == 404 && body["message"] == "no such endpoint; the API lives under /api/v1")
        || (status == 405 && body["code"] == "method_not_allowed")
}

async fn spec(http: &reqwest::Client, url: &str) -> Value {
    let r = http
        .get(format!("{url}/api/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_documented_operation_exists_and_answers_a_documented_status() {
    let cluster = shared();
    let token = cluster.admin().await.token().to_string();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let doc = spec(&http, &cluster.url).await;
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 20, "{} paths", paths.len());
    let mut probed = 0;
    let mut refusals = 0;
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            let streams = op["responses"]["200"]["content"]
                .get("text/event-stream")
                .is_some();
            let url = format!("{}{}", cluster.url, concrete(path));
            // The security schemes the operation asks for: none, `user` or
            // `peer` (an empty requirement would make credentials optional).
            let schemes: Vec<&str> = op["security"]
                .as_array()
                .map(|reqs| {
                    reqs.iter()
                        .flat_map(|r| r.as_object().unwrap().keys().map(String::as_str))
                        .collect()
                })
                .unwrap_or_default();
            let optional = op["security"]
                .as_array()
                .is_some_and(|reqs| reqs.iter().any(|r| r.as_object().unwrap().is_empty()));
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            // Without credentials, then with a user token.
            for auth in [None, Some(&token)] {
                if streams && auth.is_some() && !path.contains('{') {
                    // The caller's own stream: opens with 200 and never ends.
                    let r = http.get(&url).bearer_auth(&token).send().await.unwrap();
                    assert_eq!(r.status(), 200, "{method} {path}");
                    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
                    assert!(ct.starts_with("text/event-stream"), "{ct}");
                    continue;
                }
                let mut req = http.request(m.clone(), &url);
                if let Some(t) = auth {
                    req = req.bearer_auth(t);
                }
                if op.get("requestBody").is_some() {
                    req = req.header("content-type", "application/json").body("{}");
                }
                let r = req.send().await.unwrap();
                let status = r.status().as_u16();
                let ct = r
                    .headers()
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                let body: Value = if ct.starts_with("application/json") {
                    r.json().await.unwrap()
                } else {
                    Value::Null
                };
                let what = format!("{method} {path} (auth: {})", auth.is_some());
                assert!(
                    !is_router_fallback(status, &body),
                    "{what}: the server has no such route ({status} {body})"
                );
                assert!(
                    op["responses"].get(status.to_string()).is_some(),
                    "{what}: answered {status}, which the document does not list: {body}"
                );
                // Credentials are checked before anything else: without
                // them every protected operation is a 401, and a user token
                // opens no peer operation.
                let refused = !optional
                    && match auth {
                        None => !schemes.is_empty(),
                        Some(_) => schemes == ["peer"],
                    };
                if refused {
                    assert_eq!(
                        status, 401,
                        "{what}: served without its credentials: {body}"
                    );
                    assert_eq!(body["code"], "unauthorized", "{what}: {body}");
                    refusals += 1;
                }
                if status >= 400 {
                    assert!(
                        body["code"].is_string() && body["message"].is_string(),
                        "{what}: error {status} without an ApiError body: {body}"
                    );
                }
                probed += 1;
            }
        }
    }
    assert!(probed >= 40, "only {probed} probes");
    // 14 user operations without a token, 6 peer ones without and with a user token.
    assert!(
        refusals >= 26,
        "only {refusals} operations checked for a 401"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_undocumented_method_is_served_on_a_documented_path() {
    let cluster = shared();
    let token = cluster.admin().await.token().to_string();
    let http = reqwest::Client::new();
    let doc = spec(&http, &cluster.url).await;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let documented: Vec<&String> = item.as_object().unwrap().keys().collect();
        for method in ["get", "post", "put", "patch", "delete"] {
            if documented.iter().any(|m| *m == method) {
                continue;
            }
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let r = http
                .request(m, format!("{}{}", cluster.url, concrete(path)))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status(),
                405,
                "{method} {path} is served but not documented"
            );
            // RFC 9110: a 405 names the methods the path does accept.
            let allow = r
                .headers()
                .get("allow")
                .map(|v| v.to_str().unwrap().to_ascii_lowercase())
                .unwrap_or_default();
            for m in &documented {
                assert!(
                    allow.contains(m.as_str()),
                    "{method} {path}: Allow is {allow:?}"
                );
            }
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["code"], "method_not_allowed");
        }
    }
    // And a path the document does not have is not served either.
    let r = http
        .get(format!("{}/api/v1/undocumented", cluster.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_docs_page_renders_the_served_document() {
    let cluster = shared();
    let r = reqwest::get(format!("{}/api/docs", cluster.url))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let html = r.text().await.unwrap();
    assert!(html.contains("/api/v1/openapi.json"), "{html}");
}
