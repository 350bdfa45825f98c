//! Live percentiles of recent stage latencies: a sliding window of samples
//! per stage, for the admin page, budget advice and experiments (Prometheus
//! histograms answer the same question for dashboards, over their buckets).

use ragtime_core::Stage;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Samples kept per stage.
const WINDOW_SAMPLES: usize = 4096;

/// p50/p95/p99 of a stage over the window.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct StageStats {
    pub count: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
}

/// A stage's latencies (ms) in the window, oldest first, and how many
/// seconds they span.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    pub ms: Vec<f64>,
    pub span_s: f64,
}

pub struct LatencyWindow {
    window: Duration,
    recent: Mutex<BTreeMap<Stage, VecDeque<(Instant, f64)>>>,
}

impl LatencyWindow {
    /// `window`: how far back the percentiles look.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            recent: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    pub fn record(&self, stage: Stage, elapsed: Duration) {
        let mut r = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        let q = r.entry(stage).or_default();
        q.push_back((Instant::now(), elapsed.as_secs_f64() * 1000.0));
        while q.len() > WINDOW_SAMPLES {
            q.pop_front();
        }
    }

    pub fn samples(&self, stage: Stage) -> Samples {
        let now = Instant::now();
        let cutoff = now.checked_sub(self.window);
        let r = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(q) = r.get(&stage) else {
            return Samples::default();
        };
        let kept: Vec<&(Instant, f64)> = q
            .iter()
            .filter(|(t, _)| cutoff.is_none_or(|c| *t >= c))
            .collect();
        Samples {
            span_s: kept
                .first()
                .map_or(0.0, |(t, _)| now.duration_since(*t).as_secs_f64()),
            ms: kept.iter().map(|(_, ms)| *ms).collect(),
        }
    }

    /// p50/p95/p99 of every stage with samples in the window.
    pub fn stats(&self) -> BTreeMap<Stage, StageStats> {
        Stage::ALL
            .into_iter()
            .filter_map(|s| {
                let mut v = self.samples(s).ms;
                if v.is_empty() {
                    return None;
                }
                v.sort_by(f64::total_cmp);
                Some((
                    s,
                    StageStats {
                        count: v.len(),
                        p50_ms: percentile(&v, 50.0),
                        p95_ms: percentile(&v, 95.0),
                        p99_ms: percentile(&v, 99.0),
                    },
                ))
            })
            .collect()
    }
}

/// The `p`th percentile of sorted, non-empty `v` (nearest rank).
pub fn percentile(v: &[f64], p: f64) -> f64 {
    v[((p / 100.0) * (v.len() - 1) as f64).round() as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_percentiles_cover_the_window() {
        let w = LatencyWindow::new(Duration::from_secs(300));
        for i in 1..=100u64 {
            w.record(Stage::Retrieve, Duration::from_millis(i));
        }
        let s = w.stats();
        let r = s.get(&Stage::Retrieve).copied();
        assert_eq!(r.map(|r| r.count), Some(100));
        assert!(
            r.is_some_and(|r| (r.p50_ms - 50.0).abs() <= 1.0 && (r.p99_ms - 99.0).abs() <= 1.0),
            "{r:?}"
        );
        assert!(!s.contains_key(&Stage::Rerank));
        let old = LatencyWindow::new(Duration::ZERO);
        old.record(Stage::Embed, Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(2));
        assert!(old.stats().is_empty(), "samples older than the window");
    }
}
