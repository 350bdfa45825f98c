//! A JSON body extractor whose rejections are API errors naming the field.

use crate::error::{ApiError, ErrorCode};
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::request::Parts;
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

/// A query string parsed into `T`; rejections are API errors naming the
/// parameter (an unknown one, a repeated one, a bad value).
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let q = parts.uri.query().unwrap_or("");
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(q.as_bytes()));
        serde_path_to_error::deserialize(de)
            .map(ApiQuery)
            .map_err(|e| {
                let path = e.path().to_string();
                let msg = lower_first(&e.into_inner().to_string());
                let field = match named_field(&msg).or_else(|| duplicate_field(&msg)) {
                    Some(f) => f,
                    None if path == "." => String::new(),
                    None => path,
                };
                ApiError::invalid(field, msg)
            })
    }
}

/// Path parameters parsed into `T`; rejections (a segment whose
/// percent-encoding is not UTF-8, a bad value) are API errors naming the
/// parameter, never the framework's plain text.
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        use axum::extract::path::{ErrorKind, Path};
        use axum::extract::rejection::PathRejection;
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(ApiPath(v)),
            Err(PathRejection::FailedToDeserializePathParams(e)) => {
                let field = match e.kind() {
                    ErrorKind::InvalidUtf8InPathParam { key }
                    | ErrorKind::ParseErrorAtKey { key, .. }
                    | ErrorKind::DeserializeError { key, .. } => key.clone(),
                    _ => "path".to_owned(),
                };
                Err(ApiError::invalid(field, lower_first(&e.body_text())))
            }
            Err(e) => Err(ApiError::invalid("path", lower_first(&e.body_text()))),
        }
    }
}

fn duplicate_field(msg: &str) -> Option<String> {
    let rest = msg.strip_prefix("duplicate field `")?;
    rest.split('`').next().map(str::to_owned)
}

/// Parses a JSON object, telling syntax errors (400) from schema errors
/// (422 with the path of the offending field). Every request body is an
/// object: serde would read a struct from an array too (`[null, null]` as
/// a patch that changes nothing), so anything else is refused here.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        return match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
            Ok(_) => Err(ApiError::invalid("body", "must be a JSON object")),
            Err(e) => Err(ApiError::new(
                ErrorCode::InvalidJson,
                format!(
                    "malformed json: {}",
                    lower_first(&strip_position(&e.to_string()))
                ),
            )),
        };
    }
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
                return Err(ApiError::new(
                    ErrorCode::InvalidJson,
                    format!("malformed json: {msg}"),
                ));
            }
            let parent = if path == "." { String::new() } else { path };
            // Missing and unknown fields are reported at the parent; name them.
            let field = match named_field(&msg) {
                Some(f) if parent.is_empty() => f,
                Some(f) if !parent.ends_with(&format!(".{f}")) && parent != f => {
                    format!("{parent}.{f}")
                }
                _ => parent,
            };
            Err(ApiError::invalid(field, msg))
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

/// The field a "missing field `x`" or "unknown field `x`" message names.
fn named_field(msg: &str) -> Option<String> {
    let rest = msg
        .strip_prefix("missing field `")
        .or_else(|| msg.strip_prefix("unknown field `"))?;
    rest.split('`').next().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        a: u64,
        b: Option<u64>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        name: String,
        inner: Option<Inner>,
    }

    fn field(json: &str) -> (u16, Option<String>) {
        match parse::<Outer>(json.as_bytes()) {
            Ok(_) => (200, None),
            Err(e) => (e.code.status().as_u16(), e.field),
        }
    }

    #[test]
    fn errors_name_the_field_at_any_depth() {
        assert_eq!(field(r#"{"name": "x"}"#), (200, None));
        assert_eq!(field(r#"{}"#), (422, Some("name".into())));
        assert_eq!(
            field(r#"{"name": "x", "bogus": 1}"#),
            (422, Some("bogus".into()))
        );
        assert_eq!(field(r#"{"name": 5}"#), (422, Some("name".into())));
        assert_eq!(
            field(r#"{"name": "x", "inner": {}}"#),
            (422, Some("inner.a".into()))
        );
        assert_eq!(
            field(r#"{"name": "x", "inner": {"a": 1, "c": 2}}"#),
            (422, Some("inner.c".into()))
        );
        assert_eq!(
            field(r#"{"name": "x", "inner": {"a": -1}}"#),
            (422, Some("inner.a".into()))
        );
        assert_eq!(field(r#"{"name": "x""#).0, 400);
        // A struct is read from an object only, never from an array.
        assert_eq!(field(r#"["x", null]"#), (422, Some("body".into())));
        assert_eq!(field(r#" "x" "#), (422, Some("body".into())));
        assert_eq!(field(r#"[1, "#).0, 400);
        assert_eq!(field(r#"{"name": "x"} trailing"#).0, 400);
    }
}
