//! Names and report shapes of the latency budget.

use serde::{Deserialize, Serialize};
use std::fmt;
use utoipa::ToSchema;

/// A stage of the request pipeline, in the order a chat request runs them.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Cache,
    Embed,
    Retrieve,
    Rerank,
    LlmTtft,
    LlmGenerate,
    /// The extractive reader: the sentences of the sources that answer,
    /// chosen (with their vectors, while time allows) and quoted.
    Quote,
    /// The grounding check after generation.
    Verify,
}

impl Stage {
    /// Every stage in pipeline order.
    pub const ALL: [Stage; 8] = [
        Stage::Cache,
        Stage::Embed,
        Stage::Retrieve,
        Stage::Rerank,
        Stage::LlmTtft,
        Stage::LlmGenerate,
        Stage::Quote,
        Stage::Verify,
    ];

    /// The stable name used in config keys, span names, metrics and reports.
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Cache => "cache",
            Stage::Embed => "embed",
            Stage::Retrieve => "retrieve",
            Stage::Rerank => "rerank",
            Stage::LlmTtft => "llm_ttft",
            Stage::LlmGenerate => "llm_generate",
            Stage::Quote => "quote",
            Stage::Verify => "verify",
        }
    }

    pub fn from_name(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a stage ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Finished its work within its budget.
    Ok,
    /// Ran out of budget (or chose to stop) and kept what it had finished.
    Partial,
    /// Did not run: no budget left, budget set to zero, or not needed.
    Skipped,
    /// The primary path failed or overran; an alternative path answered.
    Fallback,
    /// Overran its budget and kept nothing.
    Timeout,
    /// Failed and kept nothing.
    Error,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::Partial,
        Outcome::Skipped,
        Outcome::Fallback,
        Outcome::Timeout,
        Outcome::Error,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Partial => "partial",
            Outcome::Skipped => "skipped",
            Outcome::Fallback => "fallback",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        }
    }

    /// True when the stage did not do all of its work.
    pub const fn is_degraded(self) -> bool {
        !matches!(self, Outcome::Ok | Outcome::Skipped)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One stage's line in a request's budget report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StageReport {
    pub stage: Stage,
    /// The budget the stage actually ran under (after deadline arithmetic).
    pub budget_ms: u64,
    pub elapsed_ms: u64,
    pub outcome: Outcome,
    /// It ran past its budget (a timeout, or work that finished late).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overran: bool,
    /// A short human note: why it was skipped, what was kept, the error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The budget story of one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BudgetReport {
    /// The request's total budget (after any per-request tightening).
    pub total_ms: u64,
    /// The request's own `budget_ms`, when it sent one: a request may
    /// tighten the configured total, never loosen it, so more than
    /// `total_ms` here says it was cut to the total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_ms: Option<u64>,
    /// Wall time from the request's start to the report.
    pub elapsed_ms: u64,
    pub stages: Vec<StageReport>,
    /// The time in no stage: reading the request, building the prompt,
    /// sending the answer (`elapsed_ms` less the stages' `elapsed_ms`).
    #[serde(default)]
    pub overhead_ms: u64,
    /// What the model was sent, when it was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<PromptReport>,
    /// The collection's indexes were not in memory (never loaded, or
    /// dropped while idle): this request loaded them from the store first,
    /// in this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_load_ms: Option<u64>,
}

/// The passages a prompt held and those left out of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PromptReport {
    /// Passages the model read (its answer's sources).
    pub passages_sent: usize,
    /// Passages found but left out: no room for them in what the backend
    /// is expected to read within `llm_ttft` (or in its context window).
    pub passages_dropped: usize,
    /// Not even the best passage fitted the `llm_ttft` allotment: it was
    /// sent all the same (a model never answers without its sources), and
    /// the first token may come late.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub over_allotment: bool,
}

impl BudgetReport {
    pub fn stage(&self, stage: Stage) -> Option<&StageReport> {
        self.stages.iter().find(|s| s.stage == stage)
    }

    /// The first stage that did not finish its work, if any.
    pub fn first_degraded(&self) -> Option<&StageReport> {
        self.stages.iter().find(|s| s.outcome.is_degraded())
    }

    /// The first stage that ran past its budget, if any.
    pub fn first_overran(&self) -> Option<&StageReport> {
        self.stages.iter().find(|s| s.overran)
    }

    /// A `Server-Timing` header value (one metric per stage plus `total`).
    pub fn server_timing(&self) -> String {
        let mut parts: Vec<String> = self
            .stages
            .iter()
            .map(|s| format!("{};desc=\"{}\";dur={}", s.stage, s.outcome, s.elapsed_ms))
            .collect();
        parts.push(format!("total;dur={}", self.elapsed_ms));
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_names_round_trip_and_match_serde() {
        for s in Stage::ALL {
            assert_eq!(Stage::from_name(s.name()), Some(s));
            let json = serde_json::to_string(&s).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", s.name()));
        }
        assert_eq!(Stage::from_name("llm"), None);
    }

    #[test]
    fn server_timing_lists_every_stage_and_total() {
        let r = BudgetReport {
            total_ms: 100,
            requested_ms: None,
            elapsed_ms: 42,
            stages: vec![
                StageReport {
                    stage: Stage::Embed,
                    budget_ms: 20,
                    elapsed_ms: 3,
                    outcome: Outcome::Ok,
                    overran: false,
                    detail: None,
                },
                StageReport {
                    stage: Stage::Rerank,
                    budget_ms: 10,
                    elapsed_ms: 10,
                    outcome: Outcome::Partial,
                    overran: true,
                    detail: Some("scored 4 of 20".into()),
                },
            ],
            index_load_ms: None,
            overhead_ms: 29,
            prompt: None,
        };
        assert_eq!(
            r.server_timing(),
            "embed;desc=\"ok\";dur=3, rerank;desc=\"partial\";dur=10, total;dur=42"
        );
        assert_eq!(r.first_degraded().map(|s| s.stage), Some(Stage::Rerank));
    }
}

/// Why an answer is partial: a stage that degraded (named as the stage
/// is), or a reason of the answer's own. Serialised as its name, the
/// `partial_reason` clients read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartialReason {
    /// The stage did not finish its work in time, or failed.
    Stage(Stage),
    /// Shed: every backend was too busy to take the request.
    Overload,
    /// The model failed, or broke off its stream.
    LlmError,
    /// The model was not asked: every backend's breaker was open after
    /// failures in a row.
    LlmUnavailable,
    /// The model began to repeat itself and was stopped there.
    Degenerate,
    /// The grounding check found the answer unsupported by its sources.
    Ungrounded,
}

impl PartialReason {
    /// The reasons that are not a stage's.
    pub const OWN: [PartialReason; 5] = [
        PartialReason::Overload,
        PartialReason::LlmError,
        PartialReason::LlmUnavailable,
        PartialReason::Degenerate,
        PartialReason::Ungrounded,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            PartialReason::Stage(s) => s.name(),
            PartialReason::Overload => "overload",
            PartialReason::LlmError => "llm_error",
            PartialReason::LlmUnavailable => "llm_unavailable",
            PartialReason::Degenerate => "degenerate",
            PartialReason::Ungrounded => "ungrounded",
        }
    }

    /// The reason named `name` (a stage's name or one of [`Self::OWN`]).
    pub fn from_name(name: &str) -> Option<PartialReason> {
        Stage::from_name(name)
            .map(PartialReason::Stage)
            .or_else(|| Self::OWN.into_iter().find(|r| r.name() == name))
    }
}

impl fmt::Display for PartialReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for PartialReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for PartialReason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        PartialReason::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown partial reason {name:?}")))
    }
}

#[cfg(test)]
mod partial_reason_tests {
    use super::*;

    #[test]
    fn every_reason_keeps_its_name_both_ways() {
        let all = Stage::ALL
            .into_iter()
            .map(PartialReason::Stage)
            .chain(PartialReason::OWN);
        for r in all {
            assert_eq!(PartialReason::from_name(r.name()), Some(r));
            let json = serde_json::to_string(&r).expect("json");
            assert_eq!(json, format!("\"{}\"", r.name()));
            assert_eq!(
                serde_json::from_str::<PartialReason>(&json).expect("back"),
                r
            );
        }
        assert_eq!(PartialReason::from_name("overloaded"), None);
    }
}
