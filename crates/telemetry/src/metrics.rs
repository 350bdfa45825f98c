//! Prometheus metrics through `prometheus-client` (OpenMetrics text), with
//! label sets typed from the pipeline's [`Stage`] and [`Outcome`], plus the
//! live stage percentiles of [`LatencyWindow`] and the counts the admin
//! page reads back.

use crate::window::LatencyWindow;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use ragtime_core::{BudgetReport, Outcome, Stage};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// Upper bounds in seconds: 1 ms to 30 s, roughly ×2.5 apart.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Time per output token: 1 ms to 1 s.
pub const TOKEN_BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 1.0];

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct StageLabel(pub Stage);

impl EncodeLabelValue for StageLabel {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(self.0.name())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct OutcomeLabel(pub Outcome);

impl EncodeLabelValue for OutcomeLabel {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(self.0.name())
    }
}

/// A stage, or the request's total.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum BudgetOf {
    Stage(Stage),
    Total,
}

impl EncodeLabelValue for BudgetOf {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(match self {
            BudgetOf::Stage(s) => s.name(),
            BudgetOf::Total => "total",
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum CacheResult {
    Hit,
    Miss,
}

impl EncodeLabelValue for CacheResult {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(match self {
            CacheResult::Hit => "hit",
            CacheResult::Miss => "miss",
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageOutcome {
    pub stage: StageLabel,
    pub outcome: OutcomeLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageOnly {
    pub stage: StageLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteStatus {
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    pub result: CacheResult,
}

/// A hot standby searches may read, by its position in
/// `database.read_urls` (never its URL: it may hold a password).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StandbyLabels {
    pub standby: u32,
}

/// How the database engine answered a filtered dense search.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum FilteredPath {
    /// Ranked exactly.
    Exact,
    /// Counted past the exact bound, then walked.
    Counted,
    /// Found broad by a sample, then walked.
    Sampled,
    /// Walked with nothing tried first.
    Walked,
}

impl EncodeLabelValue for FilteredPath {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(match self {
            FilteredPath::Exact => "exact",
            FilteredPath::Counted => "counted",
            FilteredPath::Sampled => "sampled",
            FilteredPath::Walked => "walked",
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FilteredPathLabels {
    pub path: FilteredPath,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabels {
    pub stage: BudgetOf,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    pub backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShedLabels {
    pub backend: String,
    /// `shed` (waiting could not pay off), `full` (queue at its limit).
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BreakerLabels {
    pub backend: String,
    pub state: String,
}

/// The exemplar of a latency bucket: the trace of a request that fell in it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceLabel {
    pub trace_id: String,
}

pub type LatencyHistogram = HistogramWithExemplars<TraceLabel>;

/// Observes `d` in `h`, with `trace` (and now) as its bucket's exemplar.
fn observe(h: &LatencyHistogram, d: Duration, trace: Option<&str>) {
    let exemplar = trace.map(|t| TraceLabel {
        trace_id: t.to_owned(),
    });
    h.observe(d.as_secs_f64(), exemplar, trace.map(|_| SystemTime::now()));
}

#[derive(Clone)]
struct Buckets(&'static [f64]);

impl MetricConstructor<LatencyHistogram> for Buckets {
    fn new_metric(&self) -> LatencyHistogram {
        HistogramWithExemplars::new(self.0.iter().copied())
    }
}

/// Counts since start, read back by the admin page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Per stage: how often it ran (not skipped), and overran.
    pub runs: Vec<(Stage, u64)>,
    pub overruns: Vec<(Stage, u64)>,
    /// Partial answers.
    pub partial: u64,
    /// Chat requests answered 200.
    pub chat_ok: u64,
}

/// Every metric the service exports.
pub struct Metrics {
    registry: Registry,
    stage: Family<StageOutcome, LatencyHistogram, Buckets>,
    overruns: Family<StageOnly, Counter>,
    partial: Family<Reason, Counter>,
    requests: Family<RouteStatus, Counter>,
    cache: Family<CacheLabels, Counter>,
    cache_ratio: Gauge<f64, AtomicU64>,
    ttft: LatencyHistogram,
    tpot: Histogram,
    in_flight: Gauge,
    llm_in_flight: Gauge,
    budgets: Family<BudgetLabels, Gauge<f64, AtomicU64>>,
    queue_depth: Family<BackendLabel, Gauge>,
    backend_busy: Family<BackendLabel, Gauge>,
    breaker: Family<BreakerLabels, Gauge>,
    queue_wait: Histogram,
    shed: Family<ShedLabels, Counter>,
    hedges: Counter,
    load_level: Gauge,
    index_lag_seconds: Gauge<f64, AtomicU64>,
    index_lag_entries: Gauge,
    index_resident_bytes: Gauge,
    index_mapped_bytes: Gauge,
    standby_lag_seconds: Family<StandbyLabels, Gauge<f64, AtomicU64>>,
    standby_usable: Family<StandbyLabels, Gauge>,
    filtered_searches: Family<FilteredPathLabels, Counter>,
    first_chunk: Histogram,
    runs: [AtomicU64; Stage::ALL.len()],
    partial_total: AtomicU64,
    /// Live percentiles over the last five minutes.
    pub window: LatencyWindow,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let stage = Family::new_with_constructor(Buckets(&LATENCY_BUCKETS));
        registry.register(
            "ragtime_stage_duration_seconds",
            "Time each pipeline stage took, by stage and outcome",
            stage.clone(),
        );
        let m = Self {
            stage,
            overruns: Family::default(),
            partial: Family::default(),
            requests: Family::default(),
            cache: Family::default(),
            cache_ratio: Gauge::default(),
            ttft: HistogramWithExemplars::new(LATENCY_BUCKETS.iter().copied()),
            tpot: Histogram::new(TOKEN_BUCKETS.iter().copied()),
            in_flight: Gauge::default(),
            llm_in_flight: Gauge::default(),
            budgets: Family::default(),
            queue_depth: Family::default(),
            backend_busy: Family::default(),
            breaker: Family::default(),
            queue_wait: Histogram::new(LATENCY_BUCKETS.iter().copied()),
            shed: Family::default(),
            hedges: Counter::default(),
            load_level: Gauge::default(),
            index_lag_seconds: Gauge::default(),
            index_lag_entries: Gauge::default(),
            index_resident_bytes: Gauge::default(),
            index_mapped_bytes: Gauge::default(),
            standby_lag_seconds: Family::default(),
            standby_usable: Family::default(),
            filtered_searches: Family::default(),
            first_chunk: Histogram::new(LATENCY_BUCKETS.iter().copied()),
            runs: Default::default(),
            partial_total: AtomicU64::new(0),
            window: LatencyWindow::new(Duration::from_secs(300)),
            registry,
        };
        m.register_rest()
    }

    fn register_rest(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "ragtime_stage_overruns",
            "Stages that ran out of their budget",
            self.overruns.clone(),
        );
        r.register(
            "ragtime_partial_answers",
            "Answers degraded by a stage (the stage that degraded them)",
            self.partial.clone(),
        );
        r.register(
            "ragtime_http_requests",
            "HTTP requests by route and status",
            self.requests.clone(),
        );
        r.register(
            "ragtime_cache_lookups",
            "Semantic cache lookups by result (hit, miss)",
            self.cache.clone(),
        );
        r.register(
            "ragtime_cache_hit_ratio",
            "Semantic cache hits over lookups since start",
            self.cache_ratio.clone(),
        );
        r.register(
            "ragtime_llm_ttft_seconds",
            "Time to the first token from the LLM backend",
            self.ttft.clone(),
        );
        r.register(
            "ragtime_llm_time_per_output_token_seconds",
            "Time per output token after the first",
            self.tpot.clone(),
        );
        r.register(
            "ragtime_standby_lag_seconds",
            "How far a hot standby in database.read_urls is behind the primary, as last probed",
            self.standby_lag_seconds.clone(),
        );
        r.register(
            "ragtime_standby_usable",
            "1 while searches may read the standby (it answers, is close enough and has this replica's writes)",
            self.standby_usable.clone(),
        );
        r.register(
            "ragtime_database_filtered_searches",
            "Filtered dense searches in the database engine by path: exact (ranked exactly), counted or sampled (found past the exact bound, then walked), walked (nothing tried first)",
            self.filtered_searches.clone(),
        );
        r.register(
            "ragtime_index_lag_seconds",
            "Age of the oldest change in the store's log that this replica's indexes have not applied (0 when caught up)",
            self.index_lag_seconds.clone(),
        );
        r.register(
            "ragtime_index_lag_entries",
            "Changes in the store's log this replica's indexes have not applied",
            self.index_lag_entries.clone(),
        );
        r.register(
            "ragtime_index_resident_bytes",
            "Memory the loaded collections' indexes hold (an estimate from their parts)",
            self.index_resident_bytes.clone(),
        );
        r.register(
            "ragtime_index_mapped_bytes",
            "Bytes of the files the loaded indexes read in place (memory-mapped: the page cache holds what of them is read)",
            self.index_mapped_bytes.clone(),
        );
        r.register(
            "ragtime_http_requests_in_flight",
            "Requests being served",
            self.in_flight.clone(),
        );
        r.register(
            "ragtime_llm_requests_in_flight",
            "Requests waiting on or streaming from the LLM backend (its queue depth as ragtime sees it)",
            self.llm_in_flight.clone(),
        );
        r.register(
            "ragtime_stage_budget_seconds",
            "The budget of each stage (and the total) for new requests",
            self.budgets.clone(),
        );
        r.register(
            "ragtime_llm_queue_depth",
            "Requests waiting for a slot of each LLM backend",
            self.queue_depth.clone(),
        );
        r.register(
            "ragtime_llm_backend_busy",
            "Slots of each LLM backend in use",
            self.backend_busy.clone(),
        );
        r.register(
            "ragtime_llm_breaker",
            "Each LLM backend's circuit breaker: 1 for its current state",
            self.breaker.clone(),
        );
        r.register(
            "ragtime_llm_queue_wait_seconds",
            "Time requests waited for an LLM backend's slot",
            self.queue_wait.clone(),
        );
        r.register(
            "ragtime_llm_shed",
            "Requests answered without the LLM because of load, by backend and reason",
            self.shed.clone(),
        );
        r.register(
            "ragtime_llm_hedges",
            "Requests also sent to a second backend after a slow first token",
            self.hedges.clone(),
        );
        r.register(
            "ragtime_load_level",
            "The degradation level of the latest request (0: none)",
            self.load_level.clone(),
        );
        let c = crate::sampling::counters();
        r.register(
            "ragtime_trace_spans_exported",
            "Spans handed to the OTLP exporter",
            c.exported_spans.clone(),
        );
        r.register(
            "ragtime_trace_spans_dropped",
            "Spans of traces not chosen yet that found the sampling buffer full",
            c.dropped_spans.clone(),
        );
        r.register(
            "ragtime_traces_kept_degraded",
            "Traces outside the sample ratio exported because the request degraded",
            c.kept_degraded.clone(),
        );
        r.register(
            "ragtime_traces_sampled_out",
            "Healthy traces outside the sample ratio, not exported",
            c.sampled_out.clone(),
        );
        r.register(
            "ragtime_first_chunk_seconds",
            "Time from a chat request's arrival to its first chunk (the sources)",
            self.first_chunk.clone(),
        );
        self
    }

    /// One stage's end; `trace`, the exemplar: the id of the request's
    /// trace when it is exported.
    pub fn stage(
        &self,
        stage: Stage,
        outcome: Outcome,
        elapsed: Duration,
        overran: bool,
        trace: Option<&str>,
    ) {
        let labels = StageOutcome {
            stage: StageLabel(stage),
            outcome: OutcomeLabel(outcome),
        };
        observe(&self.stage.get_or_create(&labels), elapsed, trace);
        if overran {
            self.overruns
                .get_or_create(&StageOnly {
                    stage: StageLabel(stage),
                })
                .inc();
        }
        if outcome != Outcome::Skipped {
            self.runs[stage as usize].fetch_add(1, Ordering::Relaxed);
            self.window.record(stage, elapsed);
        }
    }

    /// A finished request's budget story (`trace`: its exported trace, the
    /// exemplar of each stage's bucket), and the one log line an overrun
    /// deserves.
    pub fn record_report(&self, report: &BudgetReport, trace: Option<&str>) {
        for s in &report.stages {
            self.stage(
                s.stage,
                s.outcome,
                Duration::from_millis(s.elapsed_ms),
                s.overran,
                trace,
            );
        }
        let overran: Vec<String> = report
            .stages
            .iter()
            .filter(|s| s.overran)
            .map(|s| {
                format!(
                    "{} by {} ms ({} of {} ms, {})",
                    s.stage,
                    s.elapsed_ms.saturating_sub(s.budget_ms),
                    s.elapsed_ms,
                    s.budget_ms,
                    s.outcome
                )
            })
            .collect();
        if let Some(first) = report.first_overran() {
            tracing::warn!(
                stage = first.stage.name(),
                overrun_ms = first.elapsed_ms.saturating_sub(first.budget_ms),
                budget_ms = first.budget_ms,
                elapsed_ms = first.elapsed_ms,
                total_ms = report.total_ms,
                stages = %overran.join("; "),
                "request overran its budget"
            );
        }
    }

    pub fn partial_answer(&self, reason: &str) {
        self.partial
            .get_or_create(&Reason {
                reason: reason.to_owned(),
            })
            .inc();
        self.partial_total.fetch_add(1, Ordering::Relaxed);
    }

    pub fn request(&self, route: &str, status: u16) {
        self.requests
            .get_or_create(&RouteStatus {
                route: route.to_owned(),
                status,
            })
            .inc();
    }

    pub fn cache_lookup(&self, hit: bool) {
        let result = if hit {
            CacheResult::Hit
        } else {
            CacheResult::Miss
        };
        self.cache.get_or_create(&CacheLabels { result }).inc();
    }

    pub fn ttft(&self, d: Duration, trace: Option<&str>) {
        observe(&self.ttft, d, trace);
    }

    pub fn time_per_output_token(&self, d: Duration) {
        self.tpot.observe(d.as_secs_f64());
    }

    /// A request answered without the LLM because of load.
    pub fn shed(&self, backend: &str, reason: &str) {
        self.shed
            .get_or_create(&ShedLabels {
                backend: backend.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn queue_wait(&self, d: Duration) {
        self.queue_wait.observe(d.as_secs_f64());
    }

    pub fn hedge(&self) {
        self.hedges.inc();
    }

    pub fn load_level(&self, level: usize) {
        self.load_level
            .set(i64::try_from(level).unwrap_or(i64::MAX));
    }

    pub fn first_chunk(&self, d: Duration) {
        self.first_chunk.observe(d.as_secs_f64());
    }

    /// A backend's queue, slots in use and breaker state, now.
    pub fn set_backend(&self, backend: &str, queued: usize, busy: usize, breaker: &str) {
        let label = BackendLabel {
            backend: backend.to_owned(),
        };
        let n = |x: usize| i64::try_from(x).unwrap_or(i64::MAX);
        self.queue_depth.get_or_create(&label).set(n(queued));
        self.backend_busy.get_or_create(&label).set(n(busy));
        for state in ["closed", "open", "half_open"] {
            let l = BreakerLabels {
                backend: backend.to_owned(),
                state: state.to_owned(),
            };
            self.breaker
                .get_or_create(&l)
                .set(i64::from(state == breaker));
        }
    }

    /// How far this replica's indexes are behind the store's change log.
    pub fn set_index_lag(&self, entries: i64, seconds: f64) {
        self.index_lag_entries.set(entries);
        self.index_lag_seconds.set(seconds);
    }

    /// What the loaded indexes take, resident and mapped.
    pub fn set_index_bytes(&self, resident: usize, mapped: usize) {
        self.index_resident_bytes
            .set(i64::try_from(resident).unwrap_or(i64::MAX));
        self.index_mapped_bytes
            .set(i64::try_from(mapped).unwrap_or(i64::MAX));
    }

    /// Standby `standby`'s state at the last probe.
    pub fn set_standby(&self, standby: u32, usable: bool, lag_seconds: f64) {
        let labels = StandbyLabels { standby };
        self.standby_lag_seconds
            .get_or_create(&labels)
            .set(lag_seconds);
        self.standby_usable
            .get_or_create(&labels)
            .set(i64::from(usable));
    }

    /// The database engine's filtered dense searches since start, by how
    /// each was answered (totals; the counters move to them).
    pub fn set_filtered_searches(&self, totals: [(FilteredPath, u64); 4]) {
        for (path, total) in totals {
            let counter = self
                .filtered_searches
                .get_or_create(&FilteredPathLabels { path });
            let now = counter.get();
            if total > now {
                counter.inc_by(total - now);
            }
        }
    }

    /// The budgets in force for new requests (`None`: the total).
    pub fn set_budget(&self, stage: Option<Stage>, ms: u64) {
        let stage = stage.map_or(BudgetOf::Total, BudgetOf::Stage);
        self.budgets
            .get_or_create(&BudgetLabels { stage })
            .set(ms as f64 / 1000.0);
    }

    /// Counts a request in flight until the guard drops.
    pub fn in_flight(self: &Arc<Self>) -> InFlight {
        InFlight::new(self.in_flight.clone())
    }

    /// Counts a request waiting on or streaming from the LLM backend.
    pub fn llm_in_flight(self: &Arc<Self>) -> InFlight {
        InFlight::new(self.llm_in_flight.clone())
    }

    fn count(&self, route: &str, status: u16) -> u64 {
        self.requests
            .get(&RouteStatus {
                route: route.to_owned(),
                status,
            })
            .map_or(0, |c| c.get())
    }

    /// Counts since start for the admin page.
    pub fn totals(&self) -> Totals {
        let overruns = |s: Stage| {
            self.overruns
                .get(&StageOnly {
                    stage: StageLabel(s),
                })
                .map_or(0, |c| c.get())
        };
        Totals {
            runs: Stage::ALL
                .iter()
                .map(|s| (*s, self.runs[*s as usize].load(Ordering::Relaxed)))
                .filter(|(_, n)| *n > 0)
                .collect(),
            overruns: Stage::ALL
                .iter()
                .map(|s| (*s, overruns(*s)))
                .filter(|(_, n)| *n > 0)
                .collect(),
            partial: self.partial_total.load(Ordering::Relaxed),
            chat_ok: self.count("/v1/chat/completions", 200),
        }
    }

    /// The OpenMetrics text exposition ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let hit = |result| {
            self.cache
                .get(&CacheLabels { result })
                .map_or(0, |c| c.get())
        };
        let (hits, misses) = (hit(CacheResult::Hit), hit(CacheResult::Miss));
        self.cache_ratio.set(if hits + misses > 0 {
            hits as f64 / (hits + misses) as f64
        } else {
            0.0
        });
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "could not encode the metrics");
            let _ = writeln!(out, "# EOF");
        }
        out
    }
}

/// Decrements its gauge when dropped.
pub struct InFlight(Gauge);

impl InFlight {
    fn new(g: Gauge) -> Self {
        g.inc();
        Self(g)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_counters_and_gauges_render_as_openmetrics_text() {
        let m = Arc::new(Metrics::default());
        m.stage(
            Stage::Embed,
            Outcome::Ok,
            Duration::from_millis(3),
            false,
            None,
        );
        m.stage(
            Stage::Embed,
            Outcome::Ok,
            Duration::from_millis(30),
            false,
            Some("4bf92f3577b34da6a3ce929d0e0e4736"),
        );
        m.stage(
            Stage::Rerank,
            Outcome::Partial,
            Duration::from_millis(600),
            true,
            None,
        );
        m.cache_lookup(true);
        for _ in 0..3 {
            m.cache_lookup(false);
        }
        m.partial_answer("llm_ttft");
        m.request("/v1/search", 200);
        m.set_budget(Some(Stage::Rerank), 500);
        let g = m.in_flight();
        let text = m.render();
        for want in [
            "ragtime_stage_duration_seconds_bucket{le=\"0.005\",stage=\"embed\",outcome=\"ok\"} 1",
            "ragtime_stage_duration_seconds_bucket{le=\"0.05\",stage=\"embed\",outcome=\"ok\"} 2",
            "ragtime_stage_duration_seconds_count{stage=\"embed\",outcome=\"ok\"} 2",
            "ragtime_stage_overruns_total{stage=\"rerank\"} 1",
            "ragtime_partial_answers_total{reason=\"llm_ttft\"} 1",
            "ragtime_http_requests_total{route=\"/v1/search\",status=\"200\"} 1",
            "ragtime_cache_hit_ratio 0.25",
            "ragtime_http_requests_in_flight 1",
            "ragtime_stage_budget_seconds{stage=\"rerank\"} 0.5",
            // The exemplar: the trace of the request in that bucket.
            "ragtime_stage_duration_seconds_bucket{le=\"0.05\",stage=\"embed\",outcome=\"ok\"} 2 # {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"} 0.03 ",
            "ragtime_trace_spans_dropped_total ",
            "ragtime_traces_kept_degraded_total ",
        ] {
            assert!(text.contains(want), "{want} not in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        drop(g);
        assert!(m.render().contains("ragtime_http_requests_in_flight 0"));
        let t = m.totals();
        assert_eq!(t.runs, vec![(Stage::Embed, 2), (Stage::Rerank, 1)]);
        assert_eq!(t.overruns, vec![(Stage::Rerank, 1)]);
        assert_eq!(t.partial, 1);
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::default();
        m.request("/a\"b\nc\\d", 404);
        let text = m.render();
        assert!(
            text.contains(r#"route="/a\"b\nc\\d""#),
            "quote, newline and backslash escaped:\n{text}"
        );
    }
}
