//! The OpenAI chat request as ragtime reads it, and its checks: everything
//! is checked before any work starts, so a refused request does nothing.

use crate::error::ApiError;
use crate::routes::{check_budget_ms, check_collection, parse_filter};
use ragtime_core::Message;
use ragtime_pipeline::ChatQuery;
use ragtime_pipeline::chat::AnswerMode;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

const MAX_TOP_K: usize = 50;
const MAX_CONTENT: usize = 32 * 1024;
const MAX_MESSAGES: usize = 200;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
enum ContentIn {
    Text(String),
    Parts(Vec<PartIn>),
}

#[derive(Debug, Deserialize, ToSchema)]
struct PartIn {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
struct MessageIn {
    role: String,
    #[serde(default)]
    content: Option<ContentIn>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The request. Other OpenAI fields (`user`, `seed`, …) are accepted and
/// ignored.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatIn {
    model: String,
    messages: Vec<MessageIn>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    #[schema(format = Int64, maximum = 4294967295_u64)]
    max_tokens: Option<u32>,
    #[serde(default)]
    #[schema(format = Int64, maximum = 4294967295_u64)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    frequency_penalty: Option<f64>,
    #[serde(default)]
    #[schema(format = Int64, maximum = 4294967295_u64)]
    n: Option<u32>,
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    collection: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    filter: Option<Value>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 50)]
    top_k: Option<usize>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 3600000)]
    budget_ms: Option<u64>,
    #[serde(default)]
    conversation_id: Option<String>,
    /// `generate`, `extractive` or `quote_then_generate`.
    #[serde(default)]
    answer: Option<String>,
}

fn text_of(m: &MessageIn, i: usize) -> Result<String, ApiError> {
    let field = format!("messages[{i}].content");
    match &m.content {
        None => Ok(String::new()),
        Some(ContentIn::Text(t)) => Ok(t.clone()),
        Some(ContentIn::Parts(parts)) => {
            let mut out = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                if p.kind != "text" {
                    let msg = format!("only text parts are supported, not {:?}", p.kind);
                    return Err(ApiError::invalid(format!("{field}[{j}].type"), msg));
                }
                out.push(p.text.clone().unwrap_or_default());
            }
            Ok(out.join("\n"))
        }
    }
}

impl ChatIn {
    /// The messages' texts, checked; the last is the user's question.
    fn texts(&self) -> Result<Vec<String>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "must hold at least one message",
            ));
        }
        if self.messages.len() > MAX_MESSAGES {
            let msg = format!("at most {MAX_MESSAGES} messages");
            return Err(ApiError::invalid("messages", msg));
        }
        let mut texts = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            if !matches!(
                m.role.as_str(),
                "system" | "developer" | "user" | "assistant" | "tool"
            ) {
                let msg = format!("unknown role {:?}", m.role);
                return Err(ApiError::invalid(format!("messages[{i}].role"), msg));
            }
            let t = text_of(m, i)?;
            if t.len() > MAX_CONTENT {
                let msg = format!("longer than {MAX_CONTENT} bytes");
                return Err(ApiError::invalid(format!("messages[{i}].content"), msg));
            }
            texts.push(t);
        }
        let last = self.messages.len() - 1;
        if self.messages[last].role != "user" {
            let msg = "the last message must be the user's";
            return Err(ApiError::invalid(format!("messages[{last}].role"), msg));
        }
        if texts[last].trim().is_empty() {
            return Err(ApiError::invalid(
                format!("messages[{last}].content"),
                "must not be empty",
            ));
        }
        Ok(texts)
    }

    /// The sampling and size fields.
    fn check_options(&self) -> Result<(), ApiError> {
        if self.model.trim().is_empty() {
            return Err(ApiError::invalid("model", "must not be empty"));
        }
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid("n", "only n = 1 is supported"));
        }
        if self.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
            return Err(ApiError::invalid("temperature", "must be between 0 and 2"));
        }
        if self.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
            return Err(ApiError::invalid(
                "top_p",
                "must be greater than 0 and at most 1",
            ));
        }
        if self
            .frequency_penalty
            .is_some_and(|p| !(-2.0..=2.0).contains(&p))
        {
            return Err(ApiError::invalid(
                "frequency_penalty",
                "must be between -2 and 2",
            ));
        }
        for (name, v) in [
            ("max_tokens", self.max_tokens),
            ("max_completion_tokens", self.max_completion_tokens),
        ] {
            if v.is_some_and(|v| v == 0 || v > 32_768) {
                return Err(ApiError::invalid(name, "must be between 1 and 32768"));
            }
        }
        if self.top_k.is_some_and(|k| k == 0 || k > MAX_TOP_K) {
            let msg = format!("must be between 1 and {MAX_TOP_K}");
            return Err(ApiError::invalid("top_k", msg));
        }
        check_budget_ms(self.budget_ms)?;
        if let Some(id) = &self.conversation_id
            && !ragtime_core::valid_conversation_id(id)
        {
            let msg = "must be 1–128 characters of letters, digits, '-', '_', '.' or ':'";
            return Err(ApiError::invalid("conversation_id", msg));
        }
        Ok(())
    }

    fn answer_mode(&self) -> Result<Option<AnswerMode>, ApiError> {
        let Some(name) = &self.answer else {
            return Ok(None);
        };
        [
            AnswerMode::Generate,
            AnswerMode::Extractive,
            AnswerMode::QuoteThenGenerate,
        ]
        .into_iter()
        .find(|m| m.name() == name)
        .map(Some)
        .ok_or_else(|| {
            ApiError::invalid(
                "answer",
                format!("{name:?} is not one of generate, extractive, quote_then_generate"),
            )
        })
    }

    /// The pipeline's chat query (`traceparent`: the caller's).
    pub fn check(&self, traceparent: Option<String>) -> Result<ChatQuery, ApiError> {
        self.check_options()?;
        let texts = self.texts()?;
        let collection = self
            .collection
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        check_collection(&collection, "collection")?;
        let (filter, filter_key) = parse_filter(self.filter.as_ref())?;
        let last = texts.len() - 1;
        // Earlier turns sent by the client (system messages are ragtime's own).
        let earlier = self.messages[..last]
            .iter()
            .zip(&texts)
            .filter(|(m, t)| {
                matches!(m.role.as_str(), "user" | "assistant") && !t.trim().is_empty()
            })
            .map(|(m, t)| Message::new(&m.role, t.clone()))
            .collect();
        Ok(ChatQuery {
            collection,
            query: texts[last].trim().to_owned(),
            earlier,
            conversation_id: self.conversation_id.clone(),
            top_k: self.top_k,
            filter,
            filter_key,
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            temperature: self.temperature,
            top_p: self.top_p,
            frequency_penalty: self.frequency_penalty,
            budget_ms: self.budget_ms,
            traceparent,
            answer: self.answer_mode()?,
            stream: self.stream,
        })
    }
}
