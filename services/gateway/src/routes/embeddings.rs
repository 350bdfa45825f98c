//! `POST /v1/embeddings`, OpenAI-compatible. The embed stage runs under the
//! budget engine: off the async threads, cut at the request's deadline.

use crate::error::{ApiError, ErrorCode};
use crate::extract::ApiJson;
use crate::routes::with_timing;
use crate::state::AppState;
use axum::extract::State;
use axum::response::Response;
use ragtime_pipeline::{Done, Outcome, Policy, RequestBudget, Stage, StagePlan};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

const MAX_INPUTS: usize = 2048;
const MAX_CHARS: usize = 100_000;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingsRequest {
    input: Input,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
    /// Tightens the request's total budget (ms); never loosens it.
    #[serde(default)]
    budget_ms: Option<u64>,
}

const MODEL: &str = "all-minilm-l6-v2";

pub async fn create(
    State(state): State<Arc<AppState>>,
    tenant: crate::tenant::Tenant,
    ApiJson(req): ApiJson<EmbeddingsRequest>,
) -> Result<Response, ApiError> {
    let texts = match req.input {
        Input::One(s) => vec![s],
        Input::Many(v) => v,
    };
    if texts.is_empty() {
        return Err(ApiError::invalid("input", "must not be empty"));
    }
    if texts.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            "input",
            format!("at most {MAX_INPUTS} texts per request"),
        ));
    }
    for (i, t) in texts.iter().enumerate() {
        if t.trim().is_empty() {
            return Err(ApiError::invalid(
                format!("input[{i}]"),
                "text must not be empty",
            ));
        }
        if t.len() > MAX_CHARS {
            return Err(ApiError::invalid(
                format!("input[{i}]"),
                format!("text is longer than {MAX_CHARS} bytes"),
            ));
        }
    }
    if let Some(m) = &req.model
        && m != MODEL
    {
        return Err(ApiError::invalid(
            "model",
            format!("unknown model {m:?}; this server embeds with {MODEL:?}"),
        ));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("{other:?} is not \"float\" or \"base64\""),
            ));
        }
    };
    if req.budget_ms == Some(0) {
        return Err(ApiError::invalid("budget_ms", "must be at least 1"));
    }
    let rag = state.rag().ok_or_else(|| {
        ApiError::new(ErrorCode::NotReady, "the embedding model is still loading")
    })?;

    // A batch endpoint: the embed stage may use the request's whole budget.
    let mut profile = state.profile_for(tenant.name()).0.tightened(req.budget_ms);
    profile.embed_ms = profile.total_ms;
    let budget = RequestBudget::start(
        &profile,
        &[StagePlan::new(Stage::Embed, Policy::Required)],
        None,
    );
    let n = texts.len();
    let run = budget
        .run(Stage::Embed, move |ctx| {
            let cancel = ctx.cancel();
            async move { rag.embedder.embed(texts, cancel).await.map(Done::Full) }
        })
        .await;
    let report = budget.report();
    crate::observe::record_report(&state.metrics, &report);
    let vectors = match (run.outcome, run.value) {
        (Outcome::Ok, Some(v)) => v,
        (Outcome::Timeout | Outcome::Skipped, _) => {
            return Err(ApiError::new(
                ErrorCode::BudgetExceeded,
                format!(
                    "embedding {n} texts did not finish within {} ms",
                    report.total_ms
                ),
            )
            .with_budget(report));
        }
        (_, _) => {
            let detail = report
                .stages
                .first()
                .and_then(|s| s.detail.clone())
                .unwrap_or_default();
            return Err(ApiError::internal(format!("embedding failed: {detail}")));
        }
    };
    let data: Vec<_> = vectors
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                json!(encode_base64(&v))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let body = json!({
        "object": "list",
        "data": data,
        "model": MODEL,
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
        "budget": report,
    });
    Ok(with_timing(&report, body))
}

/// Little-endian f32 bytes, standard base64 (what OpenAI clients decode).
fn encode_base64(v: &[f32]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        let idx = [(n >> 18) & 63, (n >> 12) & 63, (n >> 6) & 63, n & 63];
        out.push(T[idx[0] as usize] as char);
        out.push(T[idx[1] as usize] as char);
        out.push(if c.len() > 1 {
            T[idx[2] as usize] as char
        } else {
            '='
        });
        out.push(if c.len() > 2 {
            T[idx[3] as usize] as char
        } else {
            '='
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::encode_base64;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        // 1.0f32 = 00 00 80 3F
        assert_eq!(encode_base64(&[1.0]), "AACAPw==");
        assert_eq!(encode_base64(&[]), "");
        assert_eq!(encode_base64(&[1.0, -2.0]).len(), 12);
    }
}
