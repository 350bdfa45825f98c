//! `POST /v1/embeddings`, OpenAI-compatible, under the budget engine.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::observe::Arrived;
use crate::routes::{Timed, check_budget_ms};
use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use ragtime_core::BudgetReport;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

const MAX_INPUTS: usize = 2048;
const MAX_CHARS: usize = 100_000;
const MODEL: &str = "all-minilm-l6-v2";

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
enum Input {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum Format {
    #[default]
    Float,
    Base64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingsIn {
    input: Input,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: Option<Format>,
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
    /// Tightens the request's total budget (ms); never loosens it.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 3600000)]
    budget_ms: Option<u64>,
}

impl EmbeddingsIn {
    fn check(self) -> Result<(Vec<String>, Format, Option<u64>), ApiError> {
        let texts = match self.input {
            Input::One(s) => vec![s],
            Input::Many(v) => v,
        };
        if texts.is_empty() {
            return Err(ApiError::invalid("input", "must not be empty"));
        }
        if texts.len() > MAX_INPUTS {
            let msg = format!("at most {MAX_INPUTS} texts per request");
            return Err(ApiError::invalid("input", msg));
        }
        for (i, t) in texts.iter().enumerate() {
            let field = format!("input[{i}]");
            if t.trim().is_empty() {
                return Err(ApiError::invalid(field, "text must not be empty"));
            }
            if t.len() > MAX_CHARS {
                let msg = format!("text is longer than {MAX_CHARS} bytes");
                return Err(ApiError::invalid(field, msg));
            }
        }
        if let Some(m) = self.model.filter(|m| m != MODEL) {
            let msg = format!("unknown model {m:?}; this server embeds with {MODEL:?}");
            return Err(ApiError::invalid("model", msg));
        }
        check_budget_ms(self.budget_ms)?;
        Ok((
            texts,
            self.encoding_format.unwrap_or_default(),
            self.budget_ms,
        ))
    }
}

#[derive(Serialize, ToSchema)]
pub struct EmbeddingsOut<'a> {
    object: &'static str,
    data: Vec<EmbeddingOut>,
    model: &'static str,
    usage: Usage,
    #[schema(value_type = BudgetReport)]
    budget: &'a BudgetReport,
}

#[derive(Serialize, ToSchema)]
struct EmbeddingOut {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    /// Little-endian f32 bytes, standard base64 (what OpenAI clients decode).
    Base64(String),
}

#[derive(Serialize, ToSchema)]
#[schema(as = EmbeddingUsage)]
struct Usage {
    prompt_tokens: u32,
    total_tokens: u32,
}

fn vector(v: Vec<f32>, format: Format) -> Vector {
    match format {
        Format::Float => Vector::Float(v),
        Format::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
            Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

/// Embed texts (OpenAI-compatible).
#[utoipa::path(post, path = "/v1/embeddings", tag = "embeddings", request_body = EmbeddingsIn,
    responses((status = 200, description = "One vector per input, in order", body = EmbeddingsOut)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    Arrived(at): Arrived,
    Caller(tenant): Caller,
    ApiJson(req): ApiJson<EmbeddingsIn>,
) -> Result<Response, ApiError> {
    let (texts, format, budget_ms) = req.check()?;
    let done = state
        .pipeline()?
        .embeddings(&tenant, texts, budget_ms, at)
        .await?;
    let data = done
        .vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| EmbeddingOut {
            object: "embedding",
            index,
            embedding: vector(v, format),
        })
        .collect();
    let body = EmbeddingsOut {
        object: "list",
        data,
        model: MODEL,
        usage: Usage {
            prompt_tokens: 0,
            total_tokens: 0,
        },
        budget: &done.report,
    };
    Ok(Timed(&done.report, body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_vectors_are_little_endian_f32_in_the_standard_alphabet() {
        // 1.0f32 = 00 00 80 3F
        let enc = |v: &[f32]| match vector(v.to_vec(), Format::Base64) {
            Vector::Base64(s) => s,
            Vector::Float(_) => String::new(),
        };
        assert_eq!(enc(&[1.0]), "AACAPw==");
        assert_eq!(enc(&[]), "");
        assert_eq!(enc(&[1.0, -2.0]).len(), 12);
    }
}
