//! Budget experiments: a share of requests runs under a candidate budget
//! profile (arm `candidate`), the rest under the budgets they would have had
//! (arm `control`), and each arm keeps its own stage latencies, TTFT and
//! partial-answer rate, so an admin can compare before rolling a change out.
//! One experiment at a time, held in memory by the replica that runs it.

use ragtime_core::BudgetReport;
use ragtime_pipeline::BudgetProfile;
use ragtime_telemetry::metrics::Metrics;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arm {
    Control,
    Candidate,
}

impl Arm {
    pub const fn name(self) -> &'static str {
        match self {
            Arm::Control => "control",
            Arm::Candidate => "candidate",
        }
    }
}

struct ArmStats {
    metrics: Metrics,
    requests: AtomicU64,
    partial: AtomicU64,
}

impl ArmStats {
    fn new() -> Self {
        Self {
            // The whole experiment, not a sliding window.
            metrics: Metrics::new(Duration::from_secs(30 * 24 * 3600)),
            requests: AtomicU64::new(0),
            partial: AtomicU64::new(0),
        }
    }

    fn report(&self) -> Value {
        let requests = self.requests.load(Ordering::Relaxed);
        let partial = self.partial.load(Ordering::Relaxed);
        let stats = self.metrics.stage_stats();
        let stages: serde_json::Map<String, Value> = stats
            .iter()
            .map(|(s, x)| {
                (
                    (*s).to_owned(),
                    json!({"count": x.count, "p50_ms": x.p50_ms, "p95_ms": x.p95_ms, "p99_ms": x.p99_ms}),
                )
            })
            .collect();
        json!({
            "requests": requests,
            "partial_rate": if requests > 0 { Some(partial as f64 / requests as f64) } else { None },
            "ttft": stages.get("llm_ttft").cloned(),
            "stages": stages,
        })
    }
}

pub struct Experiment {
    pub name: String,
    /// Share of requests in the candidate arm.
    pub share: f64,
    pub candidate: BudgetProfile,
    started_ms: u64,
    control: ArmStats,
    treated: ArmStats,
}

impl Experiment {
    pub fn new(name: String, share: f64, candidate: BudgetProfile) -> Self {
        Self {
            name,
            share,
            candidate,
            started_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            control: ArmStats::new(),
            treated: ArmStats::new(),
        }
    }

    /// Draws a request's arm and the profile it runs under.
    pub fn assign(&self, base: BudgetProfile) -> (Arm, BudgetProfile) {
        let draw = (uuid::Uuid::new_v4().as_u128() >> 64) as f64 / u64::MAX as f64;
        if draw < self.share {
            (Arm::Candidate, self.candidate)
        } else {
            (Arm::Control, base)
        }
    }

    fn arm(&self, arm: Arm) -> &ArmStats {
        match arm {
            Arm::Control => &self.control,
            Arm::Candidate => &self.treated,
        }
    }

    /// A finished request of `arm`.
    pub fn record(&self, arm: Arm, report: &BudgetReport, partial: bool) {
        let a = self.arm(arm);
        a.requests.fetch_add(1, Ordering::Relaxed);
        if partial {
            a.partial.fetch_add(1, Ordering::Relaxed);
        }
        crate::observe::record_stages(&a.metrics, report);
    }

    pub fn report(&self, budgets_of_control: &BudgetProfile) -> Value {
        let doc = |p: &BudgetProfile| {
            let stages: serde_json::Map<String, Value> = ragtime_core::Stage::ALL
                .iter()
                .map(|s| (s.name().to_owned(), json!(p.stage_ms(*s))))
                .collect();
            json!({"total_ms": p.total_ms, "stages": stages})
        };
        let mut control = self.control.report();
        control["budgets"] = doc(budgets_of_control);
        let mut candidate = self.treated.report();
        candidate["budgets"] = doc(&self.candidate);
        json!({
            "name": self.name,
            "share": self.share,
            "started_at_ms": self.started_ms,
            "arms": {"control": control, "candidate": candidate},
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_decides_the_arm() {
        let mut cand = BudgetProfile::cpu();
        cand.rerank_ms = 0;
        let all = Experiment::new("a".into(), 1.0, cand);
        let none = Experiment::new("b".into(), 0.0, cand);
        let half = Experiment::new("c".into(), 0.5, cand);
        let base = BudgetProfile::cpu();
        for _ in 0..100 {
            assert_eq!(all.assign(base), (Arm::Candidate, cand));
            assert_eq!(none.assign(base), (Arm::Control, base));
        }
        let n = (0..2000)
            .filter(|_| half.assign(base).0 == Arm::Candidate)
            .count();
        assert!((800..1200).contains(&n), "{n} of 2000");
    }
}
