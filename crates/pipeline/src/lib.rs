//! The budget engine.
//!
//! A request gets an absolute deadline when it arrives. Each stage of the
//! request runs under `min(stage budget, time left − what later mandatory
//! stages reserve)`, inside a tracing span that records the budget story, and
//! ends with an [`Outcome`]. The stage's [`Policy`] decides what the next stage
//! gets. This crate is the only place that decides what happens when time
//! runs out; the stages themselves only honour the deadline they are handed.

mod blocking;
pub mod chat;
mod engine;
mod profile;
pub mod rag;
pub mod rerank;
pub mod search;

pub use blocking::run_blocking;
pub use engine::{Done, Policy, RequestBudget, StageCtx, StagePlan, StageRun};
pub use profile::{BudgetProfile, ProfileError};
pub use ragtime_core::{BudgetReport, Cancel, Outcome, Stage, StageError, StageReport};
