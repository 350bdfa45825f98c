//! A JSON body extractor whose rejections are API errors naming the field.

use crate::error::{ApiError, ErrorCode};
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;

pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                let ct = ct
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase();
                ct == "application/json" || ct.ends_with("+json")
            });
        if !is_json {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "expected a body with content-type application/json",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(ErrorCode::PayloadTooLarge, "request body is too large")
            } else {
                ApiError::new(ErrorCode::InvalidJson, format!("cannot read body: {e}"))
            }
        })?;
        parse(&bytes).map(ApiJson)
    }
}

/// Parses JSON, telling syntax errors (400) from schema errors (422 with the
/// path of the offending field).
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize(&mut de) {
        Ok(v) => match de.end() {
            Ok(()) => Ok(v),
            Err(e) => Err(ApiError::new(
                ErrorCode::InvalidJson,
                format!(
                    "malformed json: {}",
                    lower_first(&strip_position(&e.to_string()))
                ),
            )),
        },
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let mut msg = lower_first(&strip_position(&inner.to_string()));
            if msg.starts_with("data did not match any variant") {
                msg = "has the wrong type for this field".into();
            }
            if inner.is_syntax() || inner.is_eof() {
                Err(ApiError::new(
                    ErrorCode::InvalidJson,
                    format!("malformed json: {msg}"),
                ))
            } else if path.is_empty() || path == "." {
                // Missing fields are reported at the parent; name them.
                let field = missing_field(&msg).unwrap_or_default();
                Err(ApiError::invalid(field, msg))
            } else {
                Err(ApiError::invalid(path, msg))
            }
        }
    }
}

fn strip_position(msg: &str) -> String {
    match msg.find(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

/// Lowercases a leading capital unless it starts an acronym ("EOF").
fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match (c.next(), c.clone().next()) {
        (Some(f), Some(n)) if f.is_uppercase() && !n.is_uppercase() => {
            f.to_lowercase().collect::<String>() + c.as_str()
        }
        _ => s.to_owned(),
    }
}

fn missing_field(msg: &str) -> Option<String> {
    let rest = msg.strip_prefix("missing field `")?;
    rest.split('`').next().map(str::to_owned)
}
