//! `GET /openapi.json`: the API as an OpenAPI 3.1 document, generated from
//! the request and response types (`utoipa`), and `GET /docs`, a page that
//! reads it (no external assets). What the types cannot say is added here,
//! once: the error responses every operation may give (the one error
//! table), who may call what, unique operation ids, and the links a client
//! (or schemathesis's stateful phase) follows from a created resource.

use crate::error::ErrorCode;
use axum::http::{HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::OnceLock;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "ragtime",
        description = "Retrieval-augmented answers under per-stage latency budgets. Every error is `{\"error\": {\"code\", \"message\", \"field\"?}}`."
    ),
    paths(
        super::health::healthz,
        super::health::readyz,
        super::metrics::metrics,
        document_json,
        docs,
        super::embeddings::create,
        super::documents::create,
        super::documents::list,
        super::documents::get,
        super::documents::delete,
        super::jobs::list,
        super::jobs::get,
        super::jobs::cancel,
        super::collections::list,
        super::collections::create,
        super::collections::get,
        super::collections::delete,
        super::search::search,
        super::chat::completions,
        super::chat::models,
        super::admin::page::page,
        super::admin::stats::stats,
        super::admin::collections::list,
        super::admin::budgets::get,
        super::admin::budgets::put,
        super::admin::budgets::patch,
        super::admin::budgets::history,
        super::admin::budgets::rollback,
        super::admin::budgets::advice,
        super::admin::keys::list,
        super::admin::keys::create,
        super::admin::keys::revoke,
        super::admin::tenants::get,
        super::admin::tenants::put,
        super::admin::tenants::delete,
        super::admin::tenants::get_priority,
        super::admin::tenants::put_priority,
        super::admin::tenants::delete_priority,
        super::admin::tenants::get_quotas,
        super::admin::tenants::put_quotas,
        super::admin::tenants::delete_quotas,
        super::admin::experiments::get,
        super::admin::experiments::start,
        super::admin::experiments::stop,
    ),
    components(schemas(crate::error::ErrorBody))
)]
struct ApiDoc;

/// The statuses of the error table an operation under `/v1` or `/admin`
/// may answer, each with what its codes mean (from the table's rows);
/// `rate_limited` only under `/v1`. Not listed: 405 (a method no operation
/// has) and 500.
fn errors(v1: bool) -> Vec<(ErrorCode, String)> {
    let mut out: Vec<(ErrorCode, String)> = Vec::new();
    for &code in ErrorCode::ALL {
        let skip = matches!(code, ErrorCode::MethodNotAllowed | ErrorCode::Internal)
            || (code == ErrorCode::RateLimited && !v1);
        if skip {
            continue;
        }
        let what = format!("`{}`: {}", code.as_str(), code.description());
        match out.iter_mut().find(|(c, _)| c.status() == code.status()) {
            Some((_, text)) => {
                text.push_str("; ");
                text.push_str(&what);
            }
            None => out.push((code, what)),
        }
    }
    out
}

/// Every error code's name, for the `code` field's schema.
fn error_code_names() -> Vec<&'static str> {
    ErrorCode::ALL.iter().map(|c| c.as_str()).collect()
}

/// A follow-up operation from a created resource: (from operation, status,
/// link name, to operation, parameters).
type Link = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

const LINKS: &[Link] = &[
    (
        "post_v1_collections",
        "201",
        "GetCollection",
        "get_v1_collections_name",
        &[("name", "$response.body#/name")],
    ),
    (
        "post_v1_collections",
        "201",
        "DeleteCollection",
        "delete_v1_collections_name",
        &[("name", "$response.body#/name")],
    ),
    (
        "post_v1_documents",
        "200",
        "GetDocument",
        "get_v1_documents_id",
        &[
            ("id", "$response.body#/documents/0/id"),
            ("collection", "$response.body#/collection"),
        ],
    ),
    (
        "post_v1_documents",
        "200",
        "DeleteDocument",
        "delete_v1_documents_id",
        &[
            ("id", "$response.body#/documents/0/id"),
            ("collection", "$response.body#/collection"),
        ],
    ),
    (
        "post_v1_documents",
        "202",
        "GetJob",
        "get_v1_jobs_id",
        &[("id", "$response.body#/id")],
    ),
    (
        "post_v1_documents",
        "202",
        "CancelJob",
        "delete_v1_jobs_id",
        &[("id", "$response.body#/id")],
    ),
    (
        "post_admin_keys",
        "201",
        "RevokeKey",
        "delete_admin_keys_id",
        &[("id", "$response.body#/id")],
    ),
];

/// `get /v1/documents/{id}` → `get_v1_documents_id`.
fn operation_id(method: &str, path: &str) -> String {
    let mut id = method.to_owned();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        id.push('_');
        id.extend(
            part.chars()
                .filter(|c| !matches!(c, '{' | '}'))
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
        );
    }
    id
}

/// The document as served.
pub fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|_| json!({}));
    doc["components"]["securitySchemes"] = json!({
        "api_key": {
            "type": "http", "scheme": "bearer",
            "description": "An API key (`rk_…`) made by the admin: it names your tenant. Optional unless `auth.require_api_key` is set; without one you are the `default` tenant."
        },
        "admin": {
            "type": "http", "scheme": "bearer",
            "description": "The admin key (`RAGTIME__ADMIN_KEY`)."
        }
    });
    // The `code` field's values are the error table's codes.
    for at in [
        "/components/schemas/ErrorFields/properties/code",
        "/components/schemas/ErrorBody/properties/error/properties/code",
    ] {
        if let Some(code) = doc.pointer_mut(at) {
            code["enum"] = json!(error_code_names());
        }
    }
    operations(&mut doc);
    links(&mut doc);
    doc
}

/// Every operation's id, and under `/v1` and `/admin` its security and the
/// error table's statuses.
fn operations(doc: &mut Value) {
    let error_ref = json!({"$ref": "#/components/schemas/ErrorBody"});
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, item) in paths.iter_mut() {
            let Some(ops) = item.as_object_mut() else {
                continue;
            };
            for (method, op) in ops.iter_mut() {
                op["operationId"] = json!(operation_id(method, path));
                let (v1, admin) = (path.starts_with("/v1/"), path.starts_with("/admin/"));
                if v1 {
                    op["security"] = json!([{}, {"api_key": []}]);
                } else if admin {
                    op["security"] = json!([{"admin": []}]);
                } else {
                    continue;
                }
                let responses = &mut op["responses"];
                for (code, what) in errors(v1) {
                    let status = code.status().as_u16().to_string();
                    if responses.get(&status).is_none() {
                        responses[&status] = json!({
                            "description": what,
                            "content": {"application/json": {"schema": error_ref.clone()}}
                        });
                    }
                }
            }
        }
    }
}

/// The follow-up operations of [`LINKS`].
fn links(doc: &mut Value) {
    let mut at: std::collections::HashMap<String, (String, String)> = Default::default();
    if let Some(paths) = doc["paths"].as_object() {
        for (path, item) in paths {
            for (method, op) in item.as_object().into_iter().flatten() {
                if let Some(id) = op["operationId"].as_str() {
                    at.insert(id.to_owned(), (path.clone(), method.clone()));
                }
            }
        }
    }
    for (from, status, name, to, params) in LINKS {
        let Some((path, method)) = at.get(*from) else {
            continue;
        };
        let params: serde_json::Map<String, Value> = params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        doc["paths"][path][method]["responses"][*status]["links"][*name] =
            json!({"operationId": to, "parameters": params});
    }
}

fn document_text() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| document().to_string())
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "health",
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object)))]
pub async fn document_json() -> Response {
    let mut r = document_text().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A page that reads this document.
#[utoipa::path(get, path = "/docs", tag = "health",
    responses((status = 200, description = "The page", content_type = "text/html", body = String)))]
pub async fn docs() -> Html<&'static str> {
    Html(include_str!("docs.html"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document's error statuses, their descriptions and the `code`
    /// field's values all come from the error table.
    #[test]
    fn the_error_table_is_the_documents() {
        let doc = document();
        let codes = [
            "/components/schemas/ErrorFields/properties/code/enum",
            "/components/schemas/ErrorBody/properties/error/properties/code/enum",
        ]
        .iter()
        .find_map(|at| doc.pointer(at))
        .cloned()
        .unwrap_or_default();
        assert_eq!(codes, json!(error_code_names()));
        assert!(error_code_names().contains(&"internal"));
        let op = &doc["paths"]["/v1/search"]["post"]["responses"];
        for &code in ErrorCode::ALL {
            if matches!(code, ErrorCode::MethodNotAllowed | ErrorCode::Internal) {
                continue;
            }
            let what = op[code.status().as_u16().to_string()]["description"]
                .as_str()
                .unwrap_or_default();
            // A route's own description of a status may stand instead.
            if what.contains('`') {
                assert!(what.contains(code.as_str()), "{}: {what}", code.as_str());
            }
        }
    }

    #[test]
    fn operation_ids_are_unique_and_links_point_at_operations() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut ids = std::collections::HashSet::new();
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for (method, op) in item.as_object().into_iter().flatten() {
                let id = op["operationId"].as_str().unwrap_or_default().to_owned();
                assert!(ids.insert(id.clone()), "{id} twice");
                if path.starts_with("/v1/") || path.starts_with("/admin/") {
                    assert!(op["responses"]["422"].is_object(), "{method} {path}");
                }
            }
        }
        for (from, _, _, to, _) in LINKS {
            assert!(ids.contains(*from) && ids.contains(*to), "{from} -> {to}");
        }
        assert_eq!(
            operation_id("get", "/v1/documents/{id}"),
            "get_v1_documents_id"
        );
    }
}
