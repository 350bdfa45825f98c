//! Budget advice: stage budgets for a target total from each stage's recent
//! latencies, the stage that binds, the partial-answer rate those budgets
//! would have given, and the LLM concurrency the arrival rate needs
//! (Little's law: in flight = arrival rate × time in the LLM). Pure: the
//! caller hands in the samples.

use crate::budget::profile::BudgetProfile;
use crate::budget::runtime::StageMs;
use ragtime_core::Stage;
use ragtime_telemetry::window::{Samples, percentile};
use serde::Serialize;
use std::collections::BTreeMap;

/// Headroom over the observed p95 a proposed budget gets (and at least
/// 2 ms more: reports count whole milliseconds).
const HEADROOM: f64 = 1.1;

#[derive(Debug, Clone, Serialize)]
pub struct Advice {
    pub total_ms: u64,
    /// Whether every stage's need fits in the target.
    pub fits: bool,
    pub needs_ms: f64,
    pub proposed: StageMs,
    pub binding_stage: &'static str,
    pub expected_partial_rate: f64,
    pub llm: LlmAdvice,
    pub basis: BTreeMap<&'static str, Basis>,
    pub window_s: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LlmAdvice {
    pub arrival_rate_per_s: f64,
    pub mean_time_in_llm_ms: f64,
    pub concurrency_needed: f64,
}

/// What a stage's proposal rests on.
#[derive(Debug, Clone, Serialize)]
pub struct Basis {
    pub samples: usize,
    pub p95_ms: Option<f64>,
    pub needs_ms: f64,
    /// `p95`, or `current budget` without samples.
    pub from: &'static str,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// A stage, what it needs (ms), and its samples sorted.
type Need = (Stage, f64, Vec<f64>);

/// What each stage needs: its p95 with headroom, or its current budget
/// without samples; nothing for a stage that does not run here; with its
/// sorted samples.
fn needs(
    current: &BudgetProfile,
    samples: &BTreeMap<Stage, Samples>,
    runs: &dyn Fn(Stage) -> bool,
) -> (Vec<Need>, BTreeMap<&'static str, Basis>) {
    let mut basis = BTreeMap::new();
    let mut need = Vec::new();
    for s in Stage::ALL {
        let mut v = samples.get(&s).map(|x| x.ms.clone()).unwrap_or_default();
        v.sort_by(f64::total_cmp);
        let p95 = (!v.is_empty()).then(|| percentile(&v, 95.0));
        let want = p95.map_or(current.stage_ms(s) as f64, |p| {
            (p * HEADROOM).max(p + 2.0).ceil()
        });
        let (want, from) = match p95 {
            _ if !runs(s) => (0.0, "not configured"),
            Some(_) => (want, "p95"),
            None => (want, "current budget"),
        };
        let b = Basis {
            samples: v.len(),
            p95_ms: p95,
            needs_ms: want,
            from,
        };
        basis.insert(s.name(), b);
        need.push((s, want, v));
    }
    (need, basis)
}

/// Little's law on the LLM (one `llm_ttft` sample per LLM request): the
/// concurrency the arrival rate needs at the time a request spends there.
fn llm_advice(samples: &BTreeMap<Stage, Samples>, proposed: &BudgetProfile) -> LlmAdvice {
    let none = Samples::default();
    let ttft = samples.get(&Stage::LlmTtft).unwrap_or(&none);
    let generate = samples.get(&Stage::LlmGenerate).unwrap_or(&none);
    let rate = if ttft.span_s > 0.0 {
        ttft.ms.len() as f64 / ttft.span_s.max(1.0)
    } else {
        0.0
    };
    let in_llm_ms = mean(&ttft.ms) + mean(&generate.ms);
    let at_budget_ms = in_llm_ms.min((proposed.llm_ttft_ms + proposed.llm_generate_ms) as f64);
    LlmAdvice {
        arrival_rate_per_s: rate,
        mean_time_in_llm_ms: in_llm_ms,
        concurrency_needed: (rate * at_budget_ms / 1000.0).ceil(),
    }
}

/// The LLM's stages: what a shortfall takes from first.
const LLM: [Stage; 2] = [Stage::LlmTtft, Stage::LlmGenerate];

/// Budgets for `target_ms` from `samples` (each stage's latencies in the
/// last `window_s` seconds); stages without samples keep their `current`
/// budget, and a stage that does not run here (`runs` says, e.g. rerank
/// without a reranker) gets none. Spare time goes to generation (longer
/// answers). A shortfall comes out of the LLM's two stages first: the
/// others are cheap and every answer needs them (too little for the
/// model makes answers extractive; too little to search leaves them
/// empty). Every stage that runs gets at least 1 ms while the target has
/// room.
pub fn advise(
    current: &BudgetProfile,
    samples: &BTreeMap<Stage, Samples>,
    target_ms: u64,
    window_s: u64,
    runs: &dyn Fn(Stage) -> bool,
) -> Advice {
    let (need, basis) = needs(current, samples, runs);
    let total_need: f64 = need.iter().map(|(_, w, _)| w).sum();
    let fits = total_need <= target_ms as f64;
    let target = target_ms as f64;
    let (cheap, llm): (f64, f64) = need.iter().fold((0.0, 0.0), |(c, l), (s, w, _)| {
        if LLM.contains(s) {
            (c, l + w)
        } else {
            (c + w, l)
        }
    });
    let (cheap_scale, llm_scale) = if fits {
        (1.0, 1.0)
    } else if cheap <= target {
        (1.0, (target - cheap) / llm.max(1.0))
    } else {
        // Room for the LLM stages' 1 ms each (below).
        let llm_ms = LLM.iter().filter(|s| runs(**s)).count() as f64;
        ((target - llm_ms).max(0.0) / cheap.max(1.0), 0.0)
    };
    let mut proposed = *current;
    proposed.total_ms = target_ms;
    for (s, want, _) in &need {
        let scale = if LLM.contains(s) {
            llm_scale
        } else {
            cheap_scale
        };
        proposed.set_stage_ms(*s, (want * scale).floor() as u64);
    }
    for s in Stage::ALL {
        if runs(s) && proposed.stage_ms(s) == 0 && proposed.stages_sum_ms() < target_ms {
            proposed.set_stage_ms(s, 1);
        }
    }
    if fits && runs(Stage::LlmGenerate) {
        let spare = target_ms.saturating_sub(proposed.stages_sum_ms());
        proposed.set_stage_ms(Stage::LlmGenerate, proposed.llm_generate_ms + spare);
    }
    let binding = need
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or("llm_generate", |(s, _, _)| s.name());
    // A request is partial when any stage runs past its budget; per stage,
    // the share of recent samples that would.
    let on_time: f64 = need
        .iter()
        .filter(|(_, _, v)| !v.is_empty())
        .map(|(s, _, v)| {
            let b = proposed.stage_ms(*s) as f64;
            1.0 - v.iter().filter(|ms| **ms > b).count() as f64 / v.len() as f64
        })
        .product();
    Advice {
        total_ms: target_ms,
        fits,
        needs_ms: total_need.ceil(),
        proposed: (&proposed).into(),
        binding_stage: binding,
        expected_partial_rate: 1.0 - on_time,
        llm: llm_advice(samples, &proposed),
        basis,
        window_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(ms: &[f64], span_s: f64) -> Samples {
        Samples {
            ms: ms.to_vec(),
            span_s,
        }
    }

    #[test]
    fn spare_time_goes_to_generation_and_the_result_is_valid() {
        let mut s = BTreeMap::new();
        s.insert(Stage::Embed, samples(&[3.0; 20], 10.0));
        s.insert(Stage::LlmTtft, samples(&[500.0; 20], 10.0));
        s.insert(Stage::LlmGenerate, samples(&[1000.0; 20], 10.0));
        let a = advise(&BudgetProfile::cpu(), &s, 15_000, 300, &|_| true);
        assert!(a.fits);
        // 3 ms p95: +10 % is less than +2 ms, so 5 ms.
        assert_eq!(a.proposed.embed, 5);
        assert_eq!(a.proposed.llm_ttft, 550);
        let sum = a.proposed.cache
            + a.proposed.embed
            + a.proposed.retrieve
            + a.proposed.rerank
            + a.proposed.llm_ttft
            + a.proposed.llm_generate
            + a.proposed.quote
            + a.proposed.verify;
        assert_eq!(sum, 15_000, "spare time to generation");
        assert_eq!(a.binding_stage, "llm_generate");
        assert_eq!(a.expected_partial_rate, 0.0);
        // 20 LLM requests in 10 s, 1.5 s each: 3 in flight.
        assert_eq!(a.llm.concurrency_needed, 3.0);
        assert_eq!(a.basis["cache"].from, "current budget");
    }

    #[test]
    fn a_short_target_shrinks_every_stage_and_predicts_partials() {
        let mut s = BTreeMap::new();
        let mut generated: Vec<f64> = vec![1000.0; 9];
        generated.push(5000.0);
        s.insert(Stage::LlmGenerate, samples(&generated, 10.0));
        let a = advise(&BudgetProfile::cpu(), &s, 3_000, 300, &|_| true);
        assert!(!a.fits);
        let p = a.proposed;
        assert!(p.cache + p.embed + p.retrieve + p.rerank + p.llm_ttft + p.llm_generate <= 3_000);
        assert!(a.expected_partial_rate > 0.0);
        // The cheap stages keep what they need (their current budgets:
        // no samples); the LLM's two share the rest.
        assert_eq!((p.embed, p.retrieve, p.rerank), (150, 200, 500));
        assert!(p.llm_ttft > 0 && p.llm_generate > 0, "{p:?}");
    }

    #[test]
    fn a_stage_that_does_not_run_gets_nothing_and_one_that_runs_never_zero() {
        let mut s = BTreeMap::new();
        s.insert(Stage::Embed, samples(&[40.0; 20], 10.0));
        s.insert(Stage::Retrieve, samples(&[60.0; 20], 10.0));
        s.insert(Stage::LlmTtft, samples(&[2500.0; 20], 10.0));
        let no_rerank = |st: Stage| st != Stage::Rerank;
        let a = advise(&BudgetProfile::cpu(), &s, 3_000, 300, &no_rerank);
        let p = a.proposed;
        assert_eq!(p.rerank, 0);
        assert_eq!(a.basis["rerank"].from, "not configured");
        assert_eq!((p.embed, p.retrieve), (44, 66), "{p:?}");
        // Far too little: searching shrinks, but nothing that runs is 0.
        let a = advise(&BudgetProfile::cpu(), &s, 20, 300, &no_rerank);
        let p = a.proposed;
        assert!(p.embed > 0 && p.retrieve > 0 && p.llm_ttft > 0, "{p:?}");
        assert!(
            p.cache + p.embed + p.retrieve + p.llm_ttft + p.llm_generate + p.quote + p.verify <= 20
        );
    }
}
