//! Outcome recording: each request's budget story into the metrics, onto
//! its root span and into its experiment arm, so what a request did is
//! seen the same way in metrics, traces and experiments.

use crate::budget::experiment::{Arm, Experiment};
use crate::chat::ChatAnswer;
use crate::service::Pipeline;
use ragtime_core::{BudgetReport, Outcome, PartialReason, Stage};
use std::sync::Arc;
use std::time::Duration;

/// The experiment arm a request ran in, if any.
pub(crate) type ArmOf = Option<(Arc<Experiment>, Arm)>;

impl Pipeline {
    /// A request's story into the metrics, onto its root span and into its
    /// experiment arm.
    /// Returns the request's trace id when its trace will be exported (the
    /// exemplar of its metrics).
    pub(crate) fn record(
        &self,
        report: &BudgetReport,
        partial_reason: Option<PartialReason>,
        arm: ArmOf,
    ) -> Option<String> {
        let span = tracing::Span::current();
        let degraded = partial_reason.is_some() || report.first_overran().is_some();
        let trace = ragtime_telemetry::exported_trace_id(&span, degraded);
        self.metrics.record_report(report, trace.as_deref());
        if let Some((e, a)) = arm {
            e.record(a, report, partial_reason.is_some());
        }
        span.record("ragtime.partial", partial_reason.is_some());
        if let Some(r) = partial_reason {
            span.record("ragtime.partial_reason", r.name());
        }
        trace
    }

    pub(crate) fn record_chat(&self, a: &ChatAnswer, arm: ArmOf) {
        let trace = self.record(&a.report, a.partial_reason, arm);
        let m = &self.metrics;
        if let Some(r) = a.partial_reason {
            m.partial_answer(r.name());
        }
        let ok = |s: Stage| a.report.stage(s).filter(|s| s.outcome == Outcome::Ok);
        if ok(Stage::Cache).is_some() {
            m.cache_lookup(a.cached);
        }
        if let Some(t) = ok(Stage::LlmTtft) {
            m.ttft(Duration::from_millis(t.elapsed_ms), trace.as_deref());
        }
        if let Some(d) = a.first_chunk {
            m.first_chunk(d);
        }
        if let Some(q) = a.queued {
            m.queue_wait(q);
        }
        if a.partial_reason == Some(PartialReason::Overload) {
            m.shed(a.backend.as_deref().unwrap_or("any"), "shed");
        }
        if a.hedged {
            m.hedge();
        }
        m.load_level(a.load_level);
        if let Some(g) = ok(Stage::LlmGenerate)
            && a.usage.completion_tokens > 1
        {
            m.time_per_output_token(
                Duration::from_millis(g.elapsed_ms) / (a.usage.completion_tokens - 1),
            );
        }
    }
}
