//! `[chat]`: how chat answers are made.

use super::{ConfigError, invalid};
use ragtime_pipeline::AnswerSettings;
use ragtime_pipeline::chat::{AnswerMode, OnUngrounded};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChatConfig {
    /// Passages put into the prompt (a request's `top_k` overrides it).
    pub top_k: usize,
    /// Earlier messages of a stored conversation put into the prompt.
    pub history_messages: usize,
    /// Days a conversation's messages are kept (0: for ever); a
    /// background task removes older ones every hour.
    pub retention_days: u32,
    /// `generate`, `extractive` or `quote_then_generate` (a request's
    /// `answer` overrides it). Unset: `extractive` on the embedded local
    /// model (on two cores SmolLM2-135M answers right less often than the
    /// extractive quote, and loops; `ragtime-bench answers`), `generate`
    /// with a configured backend.
    pub answer: Option<AnswerMode>,
    /// What an answer the grounding check does not support becomes:
    /// `annotate` or `extractive`.
    pub on_ungrounded: OnUngrounded,
    /// Sampling temperature when the client sends none.
    pub temperature: f64,
    /// `frequency_penalty` when the client sends none.
    pub frequency_penalty: f64,
    /// DRY sampling's strength (llama.cpp's `dry_multiplier`, 0 to 5; 0
    /// off), sent only to a backend found to be llama.cpp's server.
    pub dry_multiplier: f64,
    /// The latest tokens DRY looks back over (llama.cpp's
    /// `dry_penalty_last_n`, 1 to 32768): the prompt is in them, so a
    /// window over the whole context penalizes quoting the passages.
    pub dry_last_n: u32,
    /// `max_tokens` when the client sets none.
    pub max_tokens: u32,
}

impl Default for ChatConfig {
    fn default() -> Self {
        let a = AnswerSettings::default();
        Self {
            top_k: 5,
            history_messages: 6,
            retention_days: 30,
            answer: None,
            on_ungrounded: a.on_ungrounded,
            temperature: a.temperature,
            frequency_penalty: a.frequency_penalty,
            dry_multiplier: a.dry_multiplier,
            dry_last_n: a.dry_last_n,
            max_tokens: a.max_tokens,
        }
    }
}

impl ChatConfig {
    /// The settings in force; `local`: whether the LLM is the embedded
    /// local model.
    pub fn answer_settings(&self, local: bool) -> AnswerSettings {
        let auto = if local {
            AnswerMode::Extractive
        } else {
            AnswerMode::Generate
        };
        AnswerSettings {
            mode: self.answer.unwrap_or(auto),
            on_ungrounded: self.on_ungrounded,
            temperature: self.temperature,
            frequency_penalty: self.frequency_penalty,
            dry_multiplier: self.dry_multiplier,
            dry_last_n: self.dry_last_n,
            max_tokens: self.max_tokens,
        }
    }
}

impl ChatConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..=2.0).contains(&self.temperature) {
            return Err(invalid("chat.temperature", "must be between 0 and 2"));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(invalid(
                "chat.frequency_penalty",
                "must be between -2 and 2",
            ));
        }
        if !(0.0..=5.0).contains(&self.dry_multiplier) {
            return Err(invalid("chat.dry_multiplier", "must be between 0 and 5"));
        }
        if !(1..=32_768).contains(&self.dry_last_n) {
            return Err(invalid("chat.dry_last_n", "must be between 1 and 32768"));
        }
        if !(1..=32_768).contains(&self.max_tokens) {
            return Err(invalid("chat.max_tokens", "must be between 1 and 32768"));
        }
        if !(1..=50).contains(&self.top_k) {
            return Err(invalid("chat.top_k", "must be between 1 and 50"));
        }
        if self.history_messages > 100 {
            return Err(invalid("chat.history_messages", "must be at most 100"));
        }
        Ok(())
    }
}
