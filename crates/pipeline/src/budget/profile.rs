//! Stage budgets as configured (`[budgets]` in `ragtime.toml`).

use ragtime_core::Stage;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use thiserror::Error;

/// Total and per-stage budgets in milliseconds.
///
/// The defaults suit the embedded CPU setup (SmolLM2-135M on llama.cpp, two
/// cores). [`BudgetProfile::gpu`] is the GPU-serving profile from the
/// latency-budget literature: TTFT p95 ≤ 700 ms within a 3 s total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetProfile {
    pub total_ms: u64,
    pub cache_ms: u64,
    pub embed_ms: u64,
    pub retrieve_ms: u64,
    pub rerank_ms: u64,
    pub llm_ttft_ms: u64,
    pub llm_generate_ms: u64,
    pub quote_ms: u64,
    pub verify_ms: u64,
}

impl Default for BudgetProfile {
    fn default() -> Self {
        Self::cpu()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("budgets.{field}: {message}")]
pub struct ProfileError {
    pub field: String,
    pub message: String,
}

/// Longest budget accepted anywhere: one hour.
const MAX_MS: u64 = 3_600_000;

impl BudgetProfile {
    /// Embedded CPU defaults.
    pub const fn cpu() -> Self {
        Self {
            total_ms: 15_000,
            cache_ms: 20,
            embed_ms: 150,
            retrieve_ms: 200,
            rerank_ms: 500,
            llm_ttft_ms: 4_000,
            llm_generate_ms: 9_930,
            // The reader compares its 12 candidate sentences by their
            // vectors in 100 to 150 ms on two idle cores; a tighter
            // budget cuts that (and says so) on every answer.
            quote_ms: 150,
            verify_ms: 50,
        }
    }

    /// GPU serving (vLLM or similar): TTFT p95 ≤ 700 ms within 3 s.
    pub const fn gpu() -> Self {
        Self {
            total_ms: 3_000,
            cache_ms: 10,
            embed_ms: 30,
            retrieve_ms: 60,
            rerank_ms: 150,
            llm_ttft_ms: 700,
            llm_generate_ms: 1_950,
            quote_ms: 40,
            verify_ms: 50,
        }
    }

    pub const fn stage_ms(&self, stage: Stage) -> u64 {
        match stage {
            Stage::Cache => self.cache_ms,
            Stage::Embed => self.embed_ms,
            Stage::Retrieve => self.retrieve_ms,
            Stage::Rerank => self.rerank_ms,
            Stage::LlmTtft => self.llm_ttft_ms,
            Stage::LlmGenerate => self.llm_generate_ms,
            Stage::Quote => self.quote_ms,
            Stage::Verify => self.verify_ms,
        }
    }

    pub fn set_stage_ms(&mut self, stage: Stage, ms: u64) {
        let slot = match stage {
            Stage::Cache => &mut self.cache_ms,
            Stage::Embed => &mut self.embed_ms,
            Stage::Retrieve => &mut self.retrieve_ms,
            Stage::Rerank => &mut self.rerank_ms,
            Stage::LlmTtft => &mut self.llm_ttft_ms,
            Stage::LlmGenerate => &mut self.llm_generate_ms,
            Stage::Quote => &mut self.quote_ms,
            Stage::Verify => &mut self.verify_ms,
        };
        *slot = ms;
    }

    pub fn stage(&self, stage: Stage) -> Duration {
        Duration::from_millis(self.stage_ms(stage))
    }

    pub fn total(&self) -> Duration {
        Duration::from_millis(self.total_ms)
    }

    /// Sum of all stage budgets (the stages run one after another).
    pub fn stages_sum_ms(&self) -> u64 {
        Stage::ALL.iter().map(|s| self.stage_ms(*s)).sum()
    }

    /// Checks that the total is positive, no budget is absurd, and the stages
    /// fit in the total. The error names the offending field.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let err = |field: &str, message: String| {
            Err(ProfileError {
                field: field.to_owned(),
                message,
            })
        };
        if self.total_ms == 0 {
            return err("total_ms", "must be greater than 0".into());
        }
        if self.total_ms > MAX_MS {
            return err("total_ms", format!("must be at most {MAX_MS} ms"));
        }
        for s in Stage::ALL {
            if self.stage_ms(s) > self.total_ms {
                return err(
                    &format!("{}_ms", s.name()),
                    format!(
                        "{} ms exceeds total_ms ({} ms)",
                        self.stage_ms(s),
                        self.total_ms
                    ),
                );
            }
        }
        let sum = self.stages_sum_ms();
        if sum > self.total_ms {
            return err(
                "total_ms",
                format!(
                    "the stage budgets add up to {sum} ms, more than total_ms ({} ms)",
                    self.total_ms
                ),
            );
        }
        Ok(())
    }

    /// The profile for a request that asked for `requested_ms`: a request may
    /// tighten the total but never loosen it. When it tightens, the stages
    /// every answer needs — embedding the query and searching — keep their
    /// budgets as far as the total allows (an extractive answer is made of
    /// nothing else), and the other stages share what is left in
    /// proportion. Shrinking every stage alike gave a 100 ms request 1 ms
    /// to embed its query: no sources, whatever the machine.
    pub fn tightened(&self, requested_ms: Option<u64>) -> Self {
        let Some(req) = requested_ms else {
            return *self;
        };
        if req >= self.total_ms {
            return *self;
        }
        // ms * num / den, in u128 to avoid overflow.
        let scale = |ms: u64, num: u64, den: u64| -> u64 {
            ((ms as u128 * num as u128) / den.max(1) as u128) as u64
        };
        let search = self.embed_ms + self.retrieve_ms;
        let mut out = *self;
        out.total_ms = req;
        for s in Stage::ALL {
            let ms = self.stage_ms(s);
            let kept = match s {
                Stage::Embed if req <= search => scale(ms, req, search),
                Stage::Retrieve if req <= search => req - scale(self.embed_ms, req, search),
                Stage::Embed | Stage::Retrieve => ms,
                _ => scale(
                    ms,
                    req.saturating_sub(search),
                    self.total_ms.saturating_sub(search),
                ),
            };
            out.set_stage_ms(s, kept);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_gpu_profile_are_valid() {
        assert_eq!(BudgetProfile::cpu().validate(), Ok(()));
        assert_eq!(BudgetProfile::gpu().validate(), Ok(()));
        assert_eq!(BudgetProfile::gpu().llm_ttft_ms, 700);
        assert_eq!(BudgetProfile::gpu().total_ms, 3_000);
    }

    #[test]
    fn validation_names_the_field() {
        let mut p = BudgetProfile::cpu();
        p.total_ms = 0;
        assert_eq!(
            p.validate().map_err(|e| e.field),
            Err("total_ms".to_owned())
        );

        let mut p = BudgetProfile::cpu();
        p.rerank_ms = p.total_ms + 1;
        assert_eq!(
            p.validate().map_err(|e| e.field),
            Err("rerank_ms".to_owned())
        );

        let mut p = BudgetProfile::gpu();
        p.llm_generate_ms = 2_900; // each fits, the sum does not
        let e = p.validate().err();
        assert_eq!(e.as_ref().map(|e| e.field.as_str()), Some("total_ms"));
        assert!(
            e.map(|e| e.to_string())
                .unwrap_or_default()
                .contains("add up to")
        );
    }

    #[test]
    fn a_request_can_tighten_but_never_loosen() {
        let p = BudgetProfile::gpu();
        assert_eq!(p.tightened(None), p);
        assert_eq!(p.tightened(Some(10_000)), p);
        assert_eq!(p.tightened(Some(3_000)), p);
        // Searching keeps its budgets; the rest share what is left
        // (3000 − 90 = 2910 → 1410 ms: a little under half).
        let t = p.tightened(Some(1_500));
        assert_eq!(t.total_ms, 1_500);
        assert_eq!((t.embed_ms, t.retrieve_ms), (30, 60));
        assert_eq!(t.llm_ttft_ms, 700 * 1410 / 2910);
        assert_eq!(t.validate(), Ok(()));
        assert!(t.stages_sum_ms() <= t.total_ms);
        // Less than searching needs: searching gets all of it.
        let t = p.tightened(Some(60));
        assert_eq!((t.embed_ms, t.retrieve_ms, t.llm_ttft_ms), (20, 40, 0));
        assert_eq!(t.validate(), Ok(()));
        // The CPU defaults: a 100 ms request searches with all of it.
        let t = BudgetProfile::default().tightened(Some(100));
        assert_eq!(t.embed_ms + t.retrieve_ms, 100);
        assert_eq!(t.validate(), Ok(()));
    }
}
