//! Budget experiments: a share of requests runs under a candidate budget
//! profile (arm `candidate`), the rest under the budgets they would have had
//! (arm `control`), and each arm keeps its own stage latencies, TTFT and
//! partial-answer rate, so an admin can compare before rolling a change out.
//! One experiment at a time, held in memory by the replica that runs it.

use crate::budget::profile::BudgetProfile;
use crate::budget::runtime::BudgetsDoc;
use ragtime_core::{BudgetReport, Outcome, Stage};
use ragtime_telemetry::window::{LatencyWindow, StageStats};
use serde::Serialize;
use std::collections::BTreeMap;
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
    window: LatencyWindow,
    requests: AtomicU64,
    partial: AtomicU64,
}

/// One arm's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ArmReport {
    pub requests: u64,
    pub partial_rate: Option<f64>,
    pub ttft: Option<StageStats>,
    pub stages: BTreeMap<&'static str, StageStats>,
    pub budgets: BudgetsDoc,
}

/// The experiment, arm by arm.
#[derive(Debug, Clone, Serialize)]
pub struct ExperimentReport {
    pub name: String,
    pub share: f64,
    pub started_at_ms: u64,
    pub arms: Arms,
}

#[derive(Debug, Clone, Serialize)]
pub struct Arms {
    pub control: ArmReport,
    pub candidate: ArmReport,
}

impl ArmStats {
    fn new() -> Self {
        Self {
            // The whole experiment, not a sliding window.
            window: LatencyWindow::new(Duration::from_secs(30 * 24 * 3600)),
            requests: AtomicU64::new(0),
            partial: AtomicU64::new(0),
        }
    }

    fn report(&self, budgets: &BudgetProfile) -> ArmReport {
        let requests = self.requests.load(Ordering::Relaxed);
        let partial = self.partial.load(Ordering::Relaxed);
        let stats = self.window.stats();
        ArmReport {
            requests,
            partial_rate: (requests > 0).then(|| partial as f64 / requests as f64),
            ttft: stats.get(&Stage::LlmTtft).copied(),
            stages: stats.into_iter().map(|(s, x)| (s.name(), x)).collect(),
            budgets: BudgetsDoc::new(budgets, None),
        }
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
        for s in report
            .stages
            .iter()
            .filter(|s| s.outcome != Outcome::Skipped)
        {
            a.window
                .record(s.stage, Duration::from_millis(s.elapsed_ms));
        }
    }

    pub fn report(&self, budgets_of_control: &BudgetProfile) -> ExperimentReport {
        ExperimentReport {
            name: self.name.clone(),
            share: self.share,
            started_at_ms: self.started_ms,
            arms: Arms {
                control: self.control.report(budgets_of_control),
                candidate: self.treated.report(&self.candidate),
            },
        }
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
