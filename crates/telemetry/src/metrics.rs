//! Prometheus metrics, rendered in the text exposition format, plus a
//! sliding window of recent stage latencies for live percentiles. Small on
//! purpose: label sets are few and fixed (stage × outcome), so a map of
//! atomic histograms behind a mutex is all it takes.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Upper bounds in seconds: 1 ms to 30 s, roughly ×2.5 apart.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Time per output token: 1 ms to 1 s.
pub const TOKEN_BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 1.0];

#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    /// Sum in microseconds.
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            if s <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_us.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

type Labels = Vec<(&'static str, String)>;

fn label_text(labels: &Labels) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{{{}}}", inner.join(","))
}

struct Family<T> {
    name: &'static str,
    help: &'static str,
    series: Mutex<BTreeMap<Labels, Arc<T>>>,
}

impl<T> Family<T> {
    fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            series: Mutex::new(BTreeMap::new()),
        }
    }

    fn get(&self, labels: Labels, make: impl FnOnce() -> T) -> Arc<T> {
        self.series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(labels)
            .or_insert_with(|| Arc::new(make()))
            .clone()
    }

    fn snapshot(&self) -> Vec<(Labels, Arc<T>)> {
        self.series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Counts since start (see [`Metrics::totals`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    pub runs: BTreeMap<String, u64>,
    pub overruns: BTreeMap<String, u64>,
    pub partial: u64,
    pub requests: u64,
}

/// Live percentiles of recent stage latencies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageStats {
    pub count: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
}

/// Every metric the service exports.
pub struct Metrics {
    stage: Family<Histogram>,
    overruns: Family<AtomicU64>,
    partial: Family<AtomicU64>,
    requests: Family<AtomicU64>,
    cache: Family<AtomicU64>,
    ttft: Histogram,
    tpot: Histogram,
    in_flight: AtomicI64,
    llm_in_flight: AtomicI64,
    window: Duration,
    recent: Mutex<BTreeMap<&'static str, VecDeque<(Instant, f64)>>>,
}

/// Samples kept per stage for the live percentiles.
const WINDOW_SAMPLES: usize = 4096;

impl Default for Metrics {
    fn default() -> Self {
        Self::new(Duration::from_secs(300))
    }
}

impl Metrics {
    /// `window`: how far back the live percentiles look.
    pub fn new(window: Duration) -> Self {
        Self {
            stage: Family::new(
                "ragtime_stage_duration_seconds",
                "Time each pipeline stage took, by stage and outcome.",
            ),
            overruns: Family::new(
                "ragtime_stage_overruns_total",
                "Stages that ran out of their budget.",
            ),
            partial: Family::new(
                "ragtime_partial_answers_total",
                "Answers degraded by a stage (the stage that degraded them).",
            ),
            requests: Family::new(
                "ragtime_http_requests_total",
                "HTTP requests by route and status.",
            ),
            cache: Family::new(
                "ragtime_cache_lookups_total",
                "Semantic cache lookups by result (hit, miss).",
            ),
            ttft: Histogram::new(&LATENCY_BUCKETS),
            tpot: Histogram::new(&TOKEN_BUCKETS),
            in_flight: AtomicI64::new(0),
            llm_in_flight: AtomicI64::new(0),
            window,
            recent: Mutex::new(BTreeMap::new()),
        }
    }

    /// One stage's end.
    pub fn stage(
        &self,
        stage: &'static str,
        outcome: &'static str,
        elapsed: Duration,
        overran: bool,
    ) {
        self.stage
            .get(
                vec![("stage", stage.into()), ("outcome", outcome.into())],
                || Histogram::new(&LATENCY_BUCKETS),
            )
            .observe(elapsed);
        if overran {
            self.overruns
                .get(vec![("stage", stage.into())], || AtomicU64::new(0))
                .fetch_add(1, Ordering::Relaxed);
        }
        if outcome != "skipped" {
            let mut r = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
            let q = r.entry(stage).or_default();
            q.push_back((Instant::now(), elapsed.as_secs_f64() * 1000.0));
            while q.len() > WINDOW_SAMPLES {
                q.pop_front();
            }
        }
    }

    pub fn partial_answer(&self, reason: &str) {
        self.partial
            .get(vec![("reason", reason.to_owned())], || AtomicU64::new(0))
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn request(&self, route: &str, status: u16) {
        self.requests
            .get(
                vec![("route", route.to_owned()), ("status", status.to_string())],
                || AtomicU64::new(0),
            )
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn cache_lookup(&self, hit: bool) {
        let r = if hit { "hit" } else { "miss" };
        self.cache
            .get(vec![("result", r.into())], || AtomicU64::new(0))
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn ttft(&self, d: Duration) {
        self.ttft.observe(d);
    }

    pub fn time_per_output_token(&self, d: Duration) {
        self.tpot.observe(d);
    }

    /// Counts a request in flight until the guard drops.
    pub fn in_flight(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            m: self.clone(),
            llm: false,
        }
    }

    /// Counts a request waiting on or streaming from the LLM backend.
    pub fn llm_in_flight(self: &Arc<Self>) -> InFlight {
        self.llm_in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            m: self.clone(),
            llm: true,
        }
    }

    /// Since start: per stage, how often it ran (not skipped) and overran;
    /// partial answers; HTTP requests answered `status` on `route`.
    pub fn totals(&self, route: &str, status: u16) -> Totals {
        let mut t = Totals::default();
        for (labels, h) in self.stage.snapshot() {
            let stage = labels
                .iter()
                .find(|(k, _)| *k == "stage")
                .map(|(_, v)| v.clone());
            let skipped = labels
                .iter()
                .any(|(k, v)| *k == "outcome" && v == "skipped");
            if let (Some(stage), false) = (stage, skipped) {
                *t.runs.entry(stage).or_default() += h.count();
            }
        }
        for (labels, c) in self.overruns.snapshot() {
            if let Some((_, stage)) = labels.first() {
                *t.overruns.entry(stage.clone()).or_default() += c.load(Ordering::Relaxed);
            }
        }
        t.partial = self
            .partial
            .snapshot()
            .iter()
            .map(|(_, c)| c.load(Ordering::Relaxed))
            .sum();
        let want = vec![("route", route.to_owned()), ("status", status.to_string())];
        t.requests = self
            .requests
            .snapshot()
            .iter()
            .filter(|(l, _)| *l == want)
            .map(|(_, c)| c.load(Ordering::Relaxed))
            .sum();
        t
    }

    /// The stage's latencies (ms) in the window, oldest first, and how many
    /// seconds the window's samples span (at most the window).
    pub fn samples(&self, stage: &str) -> (Vec<f64>, f64) {
        let now = Instant::now();
        let cutoff = now.checked_sub(self.window);
        let r = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(q) = r.get(stage) else {
            return (Vec::new(), 0.0);
        };
        let kept: Vec<&(Instant, f64)> = q
            .iter()
            .filter(|(t, _)| cutoff.is_none_or(|c| *t >= c))
            .collect();
        let span = kept
            .first()
            .map_or(0.0, |(t, _)| now.duration_since(*t).as_secs_f64());
        (kept.iter().map(|(_, ms)| *ms).collect(), span)
    }

    /// p50/p95/p99 per stage over the window.
    pub fn stage_stats(&self) -> BTreeMap<&'static str, StageStats> {
        let cutoff = Instant::now().checked_sub(self.window);
        let r = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        r.iter()
            .filter_map(|(stage, q)| {
                let mut v: Vec<f64> = q
                    .iter()
                    .filter(|(t, _)| cutoff.is_none_or(|c| *t >= c))
                    .map(|(_, ms)| *ms)
                    .collect();
                if v.is_empty() {
                    return None;
                }
                v.sort_by(f64::total_cmp);
                let at = |p: f64| v[((p / 100.0) * (v.len() - 1) as f64).round() as usize];
                Some((
                    *stage,
                    StageStats {
                        count: v.len(),
                        p50_ms: at(50.0),
                        p95_ms: at(95.0),
                        p99_ms: at(99.0),
                    },
                ))
            })
            .collect()
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        render_histograms(&mut out, &self.stage);
        for fam in [&self.overruns, &self.partial, &self.requests, &self.cache] {
            let _ = writeln!(out, "# HELP {} {}", fam.name, fam.help);
            let _ = writeln!(out, "# TYPE {} counter", fam.name);
            for (labels, c) in fam.snapshot() {
                let _ = writeln!(
                    out,
                    "{}{} {}",
                    fam.name,
                    label_text(&labels),
                    c.load(Ordering::Relaxed)
                );
            }
        }
        let (hits, misses) = self
            .cache
            .snapshot()
            .iter()
            .fold((0u64, 0u64), |(h, m), (l, c)| {
                let n = c.load(Ordering::Relaxed);
                if l.iter().any(|(_, v)| v == "hit") {
                    (h + n, m)
                } else {
                    (h, m + n)
                }
            });
        let ratio = if hits + misses > 0 {
            hits as f64 / (hits + misses) as f64
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "# HELP ragtime_cache_hit_ratio Semantic cache hits over lookups since start."
        );
        let _ = writeln!(out, "# TYPE ragtime_cache_hit_ratio gauge");
        let _ = writeln!(out, "ragtime_cache_hit_ratio {ratio}");
        render_one(
            &mut out,
            "ragtime_llm_ttft_seconds",
            "Time to the first token from the LLM backend.",
            &self.ttft,
        );
        render_one(
            &mut out,
            "ragtime_llm_time_per_output_token_seconds",
            "Time per output token after the first.",
            &self.tpot,
        );
        for (name, help, v) in [
            (
                "ragtime_http_requests_in_flight",
                "Requests being served.",
                &self.in_flight,
            ),
            (
                "ragtime_llm_requests_in_flight",
                "Requests waiting on or streaming from the LLM backend (its queue depth as ragtime sees it).",
                &self.llm_in_flight,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {}", v.load(Ordering::Relaxed));
        }
        out
    }
}

fn histogram_lines(out: &mut String, name: &str, labels: &Labels, h: &Histogram) {
    for (b, c) in h.bounds.iter().zip(&h.counts) {
        let mut l = labels.clone();
        l.push(("le", format!("{b}")));
        let _ = writeln!(
            out,
            "{name}_bucket{} {}",
            label_text(&l),
            c.load(Ordering::Relaxed)
        );
    }
    let mut l = labels.clone();
    l.push(("le", "+Inf".into()));
    let count = h.count.load(Ordering::Relaxed);
    let _ = writeln!(out, "{name}_bucket{} {count}", label_text(&l));
    let sum = h.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
    let _ = writeln!(out, "{name}_sum{} {sum}", label_text(labels));
    let _ = writeln!(out, "{name}_count{} {count}", label_text(labels));
}

fn render_histograms(out: &mut String, fam: &Family<Histogram>) {
    let _ = writeln!(out, "# HELP {} {}", fam.name, fam.help);
    let _ = writeln!(out, "# TYPE {} histogram", fam.name);
    for (labels, h) in fam.snapshot() {
        histogram_lines(out, fam.name, &labels, &h);
    }
}

fn render_one(out: &mut String, name: &str, help: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    histogram_lines(out, name, &Vec::new(), h);
}

/// Decrements its gauge when dropped.
pub struct InFlight {
    m: Arc<Metrics>,
    llm: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let g = if self.llm {
            &self.m.llm_in_flight
        } else {
            &self.m.in_flight
        };
        g.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_counters_and_gauges_render_as_prometheus_text() {
        let m = Arc::new(Metrics::default());
        m.stage("embed", "ok", Duration::from_millis(3), false);
        m.stage("embed", "ok", Duration::from_millis(30), false);
        m.stage("rerank", "partial", Duration::from_millis(600), true);
        m.cache_lookup(true);
        m.cache_lookup(false);
        m.cache_lookup(false);
        m.cache_lookup(false);
        m.partial_answer("llm_ttft");
        let _g = m.in_flight();
        let text = m.render();
        assert!(text.contains("ragtime_stage_duration_seconds_bucket{stage=\"embed\",outcome=\"ok\",le=\"0.005\"} 1"), "{text}");
        assert!(text.contains(
            "ragtime_stage_duration_seconds_bucket{stage=\"embed\",outcome=\"ok\",le=\"0.05\"} 2"
        ));
        assert!(
            text.contains("ragtime_stage_duration_seconds_count{stage=\"embed\",outcome=\"ok\"} 2")
        );
        assert!(
            text.contains(
                "ragtime_stage_duration_seconds_sum{stage=\"embed\",outcome=\"ok\"} 0.033"
            )
        );
        assert!(text.contains("ragtime_stage_overruns_total{stage=\"rerank\"} 1"));
        assert!(text.contains("ragtime_partial_answers_total{reason=\"llm_ttft\"} 1"));
        assert!(text.contains("ragtime_cache_hit_ratio 0.25"));
        assert!(text.contains("ragtime_http_requests_in_flight 1"));
        drop(_g);
        assert!(m.render().contains("ragtime_http_requests_in_flight 0"));
    }

    #[test]
    fn live_percentiles_cover_the_window_and_skip_skipped_stages() {
        let m = Metrics::default();
        for i in 1..=100u64 {
            m.stage("retrieve", "ok", Duration::from_millis(i), false);
        }
        m.stage("rerank", "skipped", Duration::ZERO, false);
        let s = m.stage_stats();
        let r = s.get("retrieve").copied();
        assert_eq!(r.map(|r| r.count), Some(100));
        assert!(
            r.is_some_and(|r| (r.p50_ms - 50.0).abs() <= 1.0 && (r.p99_ms - 99.0).abs() <= 1.0),
            "{r:?}"
        );
        assert!(!s.contains_key("rerank"));
        let old = Metrics::new(Duration::ZERO);
        old.stage("embed", "ok", Duration::from_millis(1), false);
        std::thread::sleep(Duration::from_millis(2));
        assert!(
            old.stage_stats().is_empty(),
            "samples older than the window"
        );
    }
}
