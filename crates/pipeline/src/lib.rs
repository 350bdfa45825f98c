//! The budget engine and the requests it runs.
//!
//! A request gets an absolute deadline when it arrives. Each stage of the
//! request runs under `min(stage budget, time left − what later mandatory
//! stages reserve)`, inside a tracing span that records the budget story, and
//! ends with an [`Outcome`]. The stage's [`Policy`] decides what the next stage
//! gets. This crate is the only place that decides what happens when time
//! runs out; the stages themselves only honour the deadline they are handed.
//!
//! - [`budget`]: a request's deadline, allotments, outcomes and spans
//!   ([`RequestBudget`]); the budget profiles, the budgets changed at
//!   runtime with their history, experiments between profiles and advice;
//! - [`search`], [`rerank`], [`chat`], [`embeddings`]: the requests, written
//!   against the stage traits of `ragtime-core`;
//! - [`Pipeline`]: every request's owner (collection, budgets, recording);
//! - [`corpus`]: ingestion into the store and the indexes, the indexes
//!   loaded, followed, saved on local disk ([`snapshots`]) and dropped;
//! - [`backend`]: every LLM decision — admission gates, routing, hedging,
//!   circuit breakers, what each backend has shown of its speed, and how
//!   requests shrink as the backends fill up;
//! - [`jobs`]: ingest jobs in the background;
//! - [`adapters`]: the CPU-bound stage crates behind the stage traits.

pub mod adapters;
pub mod backend;
mod blocking;
pub mod budget;
pub mod chat;
mod conversations;
pub mod corpus;
pub mod embeddings;
pub mod jobs;
mod recording;
pub mod rerank;
pub mod search;
mod service;

pub use blocking::run_blocking;
pub use budget::profile::{BudgetProfile, ProfileError};
pub use budget::{Done, Policy, RequestBudget, StageCtx, StagePlan, StageRun};
pub use corpus::snapshots;
pub use ragtime_core::{BudgetReport, Cancel, Outcome, Stage, StageError, StageReport};
pub use ragtime_retrieve::LexicalUnit;
pub use service::{
    AbortOnDrop, AnswerSettings, ChatQuery, ChatStarted, IngestSlot, Pipeline, PipelineStatus,
    SearchQuery, Settings,
};

/// Why the pipeline refused or could not run a request.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The collection does not exist (named as the caller named it).
    #[error("unknown collection {0:?}")]
    UnknownCollection(String),
    /// A request field the pipeline cannot honour.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// The budget ran out before anything could be returned.
    #[error("{message}")]
    BudgetExceeded {
        message: String,
        report: Box<BudgetReport>,
    },
    /// Every LLM backend's queue is full; try again after about
    /// `retry_after`.
    #[error("every llm backend is at its queue limit")]
    Overloaded { retry_after: std::time::Duration },
    /// A queue the request needs is full (`what` says which); try again
    /// after about `retry_after`.
    #[error("{what} is full")]
    Busy {
        what: &'static str,
        retry_after: std::time::Duration,
    },
    /// A write that would take the tenant past one of its quotas
    /// (`limit` is `max_collections`, `max_documents` or `max_chunks`).
    #[error("over the {limit} quota of {value}")]
    QuotaExceeded { limit: &'static str, value: i64 },
    #[error("{0}")]
    Internal(String),
}

impl PipelineError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}
