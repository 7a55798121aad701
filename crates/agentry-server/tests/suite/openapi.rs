//! `GET /openapi.json`: the document describes exactly the routes the server answers, parses as
//! OpenAPI 3.1, and documents success and client errors.

use std::collections::{BTreeMap, BTreeSet};

use agentry_server::{AppState, router};
use agentry_store::Store;
use serde_json::Value;

use super::support::{Server, start};

/// The methods a route may answer. HEAD is implied by GET; OPTIONS never reaches the routes (the
/// CORS layer answers it on every path); CONNECT is not routable.
const METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];

type Route = (String, String);

/// Paths served but left out of the document on purpose: `/mcp` is the MCP endpoint (JSON-RPC
/// over streamable HTTP, `agentry_server::mcp_endpoint`), whose protocol the MCP specification
/// describes rather than OpenAPI; `mcp_server.rs` tests it, its authentication included.
const NOT_DOCUMENTED: [(&str, &str); 5] = [
    // Agentry as an MCP server: the MCP specification describes it.
    ("POST", "/mcp"),
    // A workflow's trigger URL: called by other systems with a signature, not an API key
    // (workflows.rs tests it).
    ("POST", "/hooks/workflows/{id}"),
    // A terminal's WebSocket: OpenAPI cannot describe its frames (terminals.rs tests it).
    ("GET", "/v1/terminals/{id}/ws"),
    // The web console's page and assets: not API operations (the console suite tests them).
    ("GET", "/"),
    ("GET", "/console/{*path}"),
];

async fn document(server: &Server) -> Value {
    let response = server
        .http
        .get(format!("{}/openapi.json", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(content_type, "application/json");
    response.json().await.unwrap()
}

/// Every (method, path) of the document.
fn documented(document: &Value) -> BTreeSet<Route> {
    let mut routes = BTreeSet::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let method = method.to_ascii_uppercase();
            if METHODS.contains(&method.as_str())
                || ["HEAD", "OPTIONS", "TRACE"].contains(&method.as_str())
            {
                routes.insert((method, path.clone()));
            }
        }
    }
    routes
}

/// Every path registered in the router `agentry serve` runs, in axum's `{param}` syntax.
///
/// axum has no API to list routes, but the router's `Debug` output names each registered path
/// (`RouteId(n): "/path"`) in its path router, before the fallback router. If that output ever
/// changes, this finds nothing and the comparison fails loudly rather than passing.
async fn registered_paths() -> BTreeSet<String> {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    let state = AppState::new(store).await.unwrap();
    let debug = format!("{:?}", router(state));
    let routes = debug
        .split("fallback_router")
        .next()
        .expect("the router's Debug output");
    let mut paths = BTreeSet::new();
    for piece in routes.split("RouteId(").skip(1) {
        let Some((id, rest)) = piece.split_once(')') else {
            continue;
        };
        if id.is_empty() || !id.bytes().all(|byte| byte.is_ascii_digit()) {
            continue;
        }
        if let Some(rest) = rest.strip_prefix(": \"")
            && let Some((path, _)) = rest.split_once('"')
        {
            paths.insert(path.to_owned());
        }
    }
    assert!(
        paths.contains("/healthz") && paths.contains("/v1/infer"),
        "could not read the routes from the router's Debug output (did axum change it?): {paths:?}"
    );
    paths
}

/// A concrete request path for a route template: each `{param}` becomes `x`.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|segment| {
            if segment.starts_with('{') && segment.ends_with('}') {
                "x"
            } else {
                segment
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Asks the live server which methods a path answers: a method it does not route is a 405.
/// Requests carry no body and no content type, so nothing is created or changed.
async fn answered_methods(server: &Server, path: &str) -> BTreeSet<String> {
    let url = format!("{}{}", server.url, concrete(path));
    let mut methods = BTreeSet::new();
    for method in METHODS {
        let response = server
            .http
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                &url,
            )
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        // Streams (the status feed) are dropped after their headers.
        drop(response);
        if status != 405 {
            methods.insert(method.to_owned());
        }
    }
    methods
}

/// Every (method, path) the server answers.
async fn served(server: &Server) -> BTreeSet<Route> {
    let mut routes = BTreeSet::new();
    for path in registered_paths().await {
        let methods = answered_methods(server, &path).await;
        assert!(
            !methods.is_empty(),
            "{path} is registered but answers no method"
        );
        for method in methods {
            routes.insert((method, path.clone()));
        }
    }
    routes
}

#[tokio::test]
async fn the_document_lists_exactly_the_routes_served() {
    let server = start().await;
    let document = document(&server).await;
    let documented = documented(&document);
    let mut served = served(&server).await;
    for (method, path) in NOT_DOCUMENTED {
        assert!(
            served.contains(&(method.to_owned(), path.to_owned())),
            "{method} {path} is excluded from the comparison but not served"
        );
        served.retain(|(_, served_path)| served_path != path);
    }
    // The seed service's API in its own shapes: its README is its reference, not this document
    // (suite/linglong.rs tests it).
    let seed = served
        .iter()
        .filter(|(_, path)| path.starts_with("/linglong/v1/"))
        .count();
    assert!(
        seed >= 17,
        "only {seed} routes of the seed's API are served"
    );
    served.retain(|(_, path)| !path.starts_with("/linglong/v1/"));
    // The OpenAI-compatible API: OpenAI's reference describes it (suite/openai_compat.rs tests
    // it).
    served.retain(|(_, path)| !path.starts_with("/openai/v1/"));
    // A2A: its specification describes it (suite/a2a.rs tests it), the default agent's card
    // at the root too.
    served
        .retain(|(_, path)| !path.starts_with("/a2a/") && !path.starts_with("/.well-known/agent"));
    let undocumented: Vec<&Route> = served.difference(&documented).collect();
    let not_served: Vec<&Route> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "served but not in /openapi.json (annotate the handler with #[utoipa::path] and register \
         it with routes!, or describe it in openapi.rs): {undocumented:?}"
    );
    assert!(
        not_served.is_empty(),
        "in /openapi.json but not served: {not_served:?}"
    );
    // The probe is not vacuous: it found the routes of every module.
    for route in [
        ("GET", "/openapi.json"),
        ("POST", "/v1/infer/stream"),
        ("DELETE", "/v1/sessions/{id}"),
        ("PUT", "/v1/tools/{name}"),
        ("DELETE", "/v1/tools/batch"),
        ("GET", "/v1/sessions/events"),
        ("GET", "/metrics"),
        ("POST", "/v1/auth/login"),
    ] {
        assert!(
            served.contains(&(route.0.to_owned(), route.1.to_owned())),
            "{route:?} not found among the served routes"
        );
    }
}

#[tokio::test]
async fn the_route_probe_tells_routes_apart() {
    // The method probe tells a routed method from an unrouted one on the same path...
    let server = start().await;
    let methods = answered_methods(&server, "/v1/sessions/{id}").await;
    assert_eq!(
        methods,
        BTreeSet::from(["DELETE".to_owned(), "GET".to_owned()])
    );
    // ...and a path nobody registered is not in the router's paths.
    let paths = registered_paths().await;
    assert!(paths.contains("/v1/sessions/{id}/fork"));
    assert!(!paths.contains("/v1/sessions/{id}/unknown"));
}

/// Resolves a local `$ref` (`#/a/b`) in the document.
fn resolve<'a>(document: &'a Value, reference: &str) -> Option<&'a Value> {
    document.pointer(reference.strip_prefix('#')?)
}

/// Every `$ref` anywhere in the value.
fn references(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("$ref", Value::String(reference)) => found.push(reference.clone()),
                    _ => references(value, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| references(item, found)),
        _ => {}
    }
}

#[tokio::test]
async fn the_document_is_openapi_3_1() {
    let server = start().await;
    let document = document(&server).await;
    let text = serde_json::to_string(&document).unwrap();
    let spec = oas3::from_json(&text).expect("the document parses as OpenAPI 3.1");
    let version = spec.validate_version().expect("an OpenAPI 3.1 version");
    assert_eq!((version.major, version.minor), (3, 1));
    assert_eq!(spec.info.title, "Agentry");

    // Every reference resolves, and operation ids are unique.
    let mut found = Vec::new();
    references(&document, &mut found);
    assert!(
        found.len() > 50,
        "expected shared components, found {found:?}"
    );
    for reference in &found {
        assert!(
            resolve(&document, reference).is_some(),
            "{reference} does not resolve"
        );
    }
    let mut ids = BTreeSet::new();
    let mut operations = 0;
    for (path, method, operation) in spec.operations() {
        operations += 1;
        let id = operation.operation_id.clone().unwrap_or_default();
        assert!(!id.is_empty(), "{method} {path} has no operation id");
        assert!(ids.insert(id.clone()), "operation id {id} is used twice");
        for parameter in &operation.parameters {
            parameter.resolve(&spec).expect("a parameter that resolves");
        }
        if let Some(body) = &operation.request_body {
            body.resolve(&spec).expect("a request body that resolves");
        }
        for response in operation.responses.iter().flat_map(|map| map.values()) {
            response.resolve(&spec).expect("a response that resolves");
        }
        // Each `{param}` of the path is a documented path parameter, and the other way round.
        let in_path: BTreeSet<String> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .map(str::to_owned)
            .collect();
        let declared: BTreeSet<String> = operation
            .parameters
            .iter()
            .map(|p| p.resolve(&spec).unwrap())
            .filter(|p| p.location == oas3::spec::ParameterIn::Path)
            .map(|p| p.name)
            .collect();
        assert_eq!(in_path, declared, "path parameters of {method} {path}");
    }
    assert_eq!(operations, documented(&document).len());

    // Links (which the API fuzzer follows) name operations that exist.
    let mut linked = 0;
    for item in document["paths"].as_object().unwrap().values() {
        for operation in item.as_object().unwrap().values() {
            for response in operation["responses"].as_object().unwrap().values() {
                for link in response["links"]
                    .as_object()
                    .into_iter()
                    .flat_map(|l| l.values())
                {
                    linked += 1;
                    let id = link["operationId"].as_str().unwrap();
                    assert!(ids.contains(id), "a link names the unknown operation {id}");
                }
            }
        }
    }
    assert!(linked > 0, "no links");
}

/// The statuses an operation documents.
fn statuses(operation: &Value) -> Vec<u16> {
    operation["responses"]
        .as_object()
        .unwrap()
        .keys()
        .filter_map(|status| status.parse().ok())
        .collect()
}

#[tokio::test]
async fn every_operation_documents_success_and_its_client_errors() {
    let server = start().await;
    let document = document(&server).await;
    let mut missing = BTreeMap::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let statuses = statuses(operation);
            let takes_input = operation.get("requestBody").is_some()
                || operation["parameters"]
                    .as_array()
                    .is_some_and(|parameters| !parameters.is_empty());
            if !statuses.iter().any(|status| (200..300).contains(status)) {
                missing.insert(format!("{method} {path}"), "no 2xx");
            }
            if takes_input && !statuses.iter().any(|status| (400..500).contains(status)) {
                missing.insert(format!("{method} {path}"), "takes input but has no 4xx");
            }
        }
    }
    assert!(missing.is_empty(), "{missing:?}");
}

#[tokio::test]
async fn errors_are_documented_once_and_match_what_the_server_sends() {
    let server = start().await;
    let document = document(&server).await;
    let error_body = &document["components"]["schemas"]["ErrorBody"];
    assert_eq!(error_body["required"], serde_json::json!(["error"]));
    let detail = resolve(
        &document,
        error_body["properties"]["error"]["$ref"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(detail["required"], serde_json::json!(["code", "message"]));

    // Every reusable error response carries the ErrorBody schema, and operations reference them.
    let responses = document["components"]["responses"].as_object().unwrap();
    for name in [
        "BadRequest",
        "Unauthorized",
        "NotFound",
        "Conflict",
        "PayloadTooLarge",
    ] {
        assert_eq!(
            responses[name]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/ErrorBody",
            "{name}"
        );
    }
    let get_model = &document["paths"]["/v1/models/{id}"]["get"]["responses"];
    assert_eq!(get_model["404"]["$ref"], "#/components/responses/NotFound");
    assert_eq!(
        get_model["401"]["$ref"],
        "#/components/responses/Unauthorized"
    );
    // Routes outside /v1 need no credentials.
    assert!(
        document["paths"]["/healthz"]["get"]["responses"]
            .get("401")
            .is_none()
    );

    // A real error has the documented shape.
    let (status, body) = server.get("/v1/models/nothing-here").await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "not_found");
    assert!(body["error"]["message"].is_string());
    let fields: BTreeSet<&String> = body["error"].as_object().unwrap().keys().collect();
    let documented: BTreeSet<&String> = detail["properties"].as_object().unwrap().keys().collect();
    assert!(
        fields.is_subset(&documented),
        "{fields:?} vs {documented:?}"
    );
}
