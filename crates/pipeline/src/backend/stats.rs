//! What the backend has shown of its speed, learned from every completion:
//! time to first token as a function of prompt length (prefill), time per
//! output token, and characters per token of the prompts sent. The pipeline
//! sizes the context and `max_tokens` from these so that a request fits its
//! budget; nothing here is guessed once the backend has answered a few times.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Weight of the past in every running estimate (per observation).
const DECAY: f64 = 0.9;

/// One finished completion, as measured by the caller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// Characters of prompt text sent (all messages).
    pub prompt_chars: usize,
    /// Prompt tokens the backend reported (0 if it did not say).
    pub prompt_tokens: u32,
    pub ttft: Duration,
    /// Output tokens after the first, and the time they took.
    pub later_tokens: u32,
    pub generate: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimates {
    /// TTFT ≈ `ttft_base_ms + ms_per_prompt_token · prompt tokens`.
    pub ttft_base_ms: f64,
    pub ms_per_prompt_token: f64,
    /// Time per output token after the first.
    pub ms_per_output_token: f64,
    pub chars_per_token: f64,
    /// Time to read one prompt token, from the backend's own progress
    /// reports (first progress event to first token, the tokens it read
    /// in between: no queueing, no other request's prompt); `None` until a
    /// backend that reports progress has answered.
    pub ms_per_read_token: Option<f64>,
    /// Completions observed so far.
    pub observations: u64,
}

impl Estimates {
    /// Before the first completion: cautious figures for a small CPU model.
    pub const PRIOR: Estimates = Estimates {
        ttft_base_ms: 50.0,
        ms_per_prompt_token: 2.0,
        ms_per_output_token: 40.0,
        chars_per_token: 3.5,
        ms_per_read_token: None,
        observations: 0,
    };

    /// Milliseconds before the first token, and a prompt token: the
    /// reading rate the backend's progress shows when it reports it, else
    /// the time-to-first-token line fitted on completions. (That line
    /// learns only from requests that got their first token, and those
    /// cut over early for a slow prefill are the slow ones: on a backend
    /// that reports progress it would learn too fast a rate and let
    /// prompts grow.)
    pub fn ttft_line(&self) -> (f64, f64) {
        match self.ms_per_read_token {
            Some(ms) => (0.0, ms),
            None => (self.ttft_base_ms, self.ms_per_prompt_token),
        }
    }

    /// Prompt tokens that fit into a TTFT of `ttft`.
    pub fn prompt_tokens_within(&self, ttft: Duration) -> usize {
        let (base, per) = self.ttft_line();
        let ms = ttft.as_secs_f64() * 1000.0 - base;
        if ms <= 0.0 {
            return 0;
        }
        (ms / per.max(1e-3)) as usize
    }

    /// Tokens in `chars` characters of prompt at this backend's ratio
    /// (at least one character a token).
    pub fn tokens_in(&self, chars: usize) -> f64 {
        chars as f64 / self.chars_per_token.max(1.0)
    }

    /// Output tokens that fit into `generate` (after the first token).
    pub fn output_tokens_within(&self, generate: Duration) -> usize {
        let ms = generate.as_secs_f64() * 1000.0;
        1 + (ms / self.ms_per_output_token.max(1e-3)) as usize
    }
}

/// Exponentially weighted least squares of y on x.
#[derive(Debug, Clone, Copy, Default)]
struct Fit {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

impl Fit {
    fn add(&mut self, x: f64, y: f64) {
        self.w = self.w * DECAY + 1.0;
        self.x = self.x * DECAY + x;
        self.y = self.y * DECAY + y;
        self.xx = self.xx * DECAY + x * x;
        self.xy = self.xy * DECAY + x * y;
    }

    /// (intercept, slope), or `None` without enough spread in x.
    fn line(&self) -> Option<(f64, f64)> {
        if self.w < 2.0 {
            return None;
        }
        let (mx, my) = (self.x / self.w, self.y / self.w);
        let var = self.xx / self.w - mx * mx;
        if var < (0.05 * mx).powi(2).max(1.0) {
            return None;
        }
        let slope = (self.xy / self.w - mx * my) / var;
        Some((my - slope * mx, slope))
    }
}

#[derive(Debug, Clone, Copy)]
struct Inner {
    est: Estimates,
    ttft: Fit,
}

/// Running estimates for one backend, shared by every request.
#[derive(Debug)]
pub struct BackendStats {
    inner: Mutex<Inner>,
}

impl Default for BackendStats {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                est: Estimates::PRIOR,
                ttft: Fit::default(),
            }),
        }
    }
}

fn ewma(old: f64, new: f64, first: bool) -> f64 {
    if first {
        new
    } else {
        old * DECAY + new * (1.0 - DECAY)
    }
}

impl BackendStats {
    pub fn estimates(&self) -> Estimates {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .est
    }

    /// No first token came within `waited` for a prompt of about
    /// `prompt_tokens`: prefill is at least that slow, or the backend is
    /// stalled. Either way the next prompts shrink, a quarter of the way
    /// towards that rate at a time (one stall must not empty the context).
    pub fn observe_timeout(&self, prompt_tokens: u32, waited: Duration) {
        if prompt_tokens == 0 {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let per = (waited.as_secs_f64() * 1000.0 - g.est.ttft_base_ms).max(0.0)
            / f64::from(prompt_tokens);
        if per > g.est.ms_per_prompt_token {
            g.est.ms_per_prompt_token = g.est.ms_per_prompt_token * 0.75 + per * 0.25;
        }
    }

    /// A prompt of `tokens` (those not already in the backend's cache)
    /// was read in `took`, from its first progress event to its first
    /// token: the backend's own reading rate, without time spent waiting
    /// behind other prompts.
    pub fn observe_reading(&self, tokens: u32, took: Duration) {
        if tokens < 16 {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let per = took.as_secs_f64() * 1000.0 / f64::from(tokens);
        g.est.ms_per_read_token = Some(
            g.est
                .ms_per_read_token
                .map_or(per, |old| ewma(old, per, false)),
        );
    }

    pub fn observe(&self, o: Observation) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let first = g.est.observations == 0;
        let ttft_ms = o.ttft.as_secs_f64() * 1000.0;
        if o.prompt_tokens > 0 {
            let tokens = f64::from(o.prompt_tokens);
            if o.prompt_chars > 0 {
                g.est.chars_per_token =
                    ewma(g.est.chars_per_token, o.prompt_chars as f64 / tokens, first);
            }
            g.ttft.add(tokens, ttft_ms);
            match g.ttft.line() {
                Some((base, slope)) if slope > 0.0 => {
                    g.est.ttft_base_ms = base.max(0.0);
                    g.est.ms_per_prompt_token = slope;
                }
                // Too little spread in prompt lengths to separate the two:
                // charge everything to the prompt (a cautious upper bound).
                _ => {
                    g.est.ttft_base_ms = 0.0;
                    g.est.ms_per_prompt_token =
                        ewma(g.est.ms_per_prompt_token, ttft_ms / tokens, first);
                }
            }
        }
        if o.later_tokens > 0 {
            let per = o.generate.as_secs_f64() * 1000.0 / f64::from(o.later_tokens);
            g.est.ms_per_output_token = ewma(g.est.ms_per_output_token, per, first);
        }
        g.est.observations += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(prompt_tokens: u32, ttft_ms: u64, later: u32, gen_ms: u64) -> Observation {
        Observation {
            prompt_chars: prompt_tokens as usize * 4,
            prompt_tokens,
            ttft: Duration::from_millis(ttft_ms),
            later_tokens: later,
            generate: Duration::from_millis(gen_ms),
        }
    }

    #[test]
    fn learns_prefill_line_and_token_rate() {
        let s = BackendStats::default();
        assert_eq!(s.estimates(), Estimates::PRIOR);
        // A backend with 20 ms overhead and 0.5 ms per prompt token, 10 ms
        // per output token.
        for (i, n) in [100u32, 400, 800, 200, 1200, 600, 300, 900]
            .iter()
            .enumerate()
        {
            let ttft = 20 + u64::from(*n) / 2;
            s.observe(obs(*n, ttft, 10 + i as u32, 10 * (10 + i as u64)));
        }
        let e = s.estimates();
        assert!((e.ms_per_prompt_token - 0.5).abs() < 0.01, "{e:?}");
        assert!((e.ttft_base_ms - 20.0).abs() < 2.0, "{e:?}");
        assert!((e.ms_per_output_token - 10.0).abs() < 0.01, "{e:?}");
        assert!((e.chars_per_token - 4.0).abs() < 1e-9);
        // 1 s of TTFT holds (1000 − 20) / 0.5 ≈ 1960 prompt tokens.
        let n = e.prompt_tokens_within(Duration::from_secs(1));
        assert!((1940..=1980).contains(&n), "{n}");
        assert_eq!(e.output_tokens_within(Duration::from_millis(100)), 11);
    }

    #[test]
    fn the_reading_rate_is_learned_from_progress_only() {
        let s = BackendStats::default();
        assert_eq!(s.estimates().ms_per_read_token, None);
        // A prompt mostly in the cache teaches nothing.
        s.observe_reading(3, Duration::from_millis(40));
        assert_eq!(s.estimates().ms_per_read_token, None);
        s.observe_reading(500, Duration::from_millis(1000));
        assert_eq!(s.estimates().ms_per_read_token, Some(2.0));
        s.observe_reading(500, Duration::from_millis(2000));
        let r = s.estimates().ms_per_read_token.unwrap_or_default();
        assert!((r - 2.2).abs() < 1e-9, "{r}");
        // Completions do not move it.
        s.observe(obs(100, 3000, 1, 10));
        assert_eq!(s.estimates().ms_per_read_token, Some(r));
        // Prompts are sized by it: 1.1 s of reading at 2.2 ms a token.
        let n = s
            .estimates()
            .prompt_tokens_within(Duration::from_millis(1100));
        assert!((499..=500).contains(&n), "{n}");
    }

    #[test]
    fn a_timeout_shrinks_prompts_gradually() {
        let s = BackendStats::default();
        let before = s.estimates().ms_per_prompt_token;
        s.observe_timeout(100, Duration::from_millis(1050));
        let after = s.estimates().ms_per_prompt_token;
        // 10 ms/token observed as a lower bound: a quarter of the way there.
        assert!((after - (before * 0.75 + 2.5)).abs() < 1e-9, "{after}");
        // A timeout faster than the current estimate teaches nothing.
        s.observe_timeout(100, Duration::from_millis(60));
        assert_eq!(s.estimates().ms_per_prompt_token, after);
    }

    #[test]
    fn same_length_prompts_charge_the_whole_ttft_to_the_prompt() {
        let s = BackendStats::default();
        for _ in 0..5 {
            s.observe(obs(100, 300, 0, 0));
        }
        let e = s.estimates();
        assert_eq!(e.ttft_base_ms, 0.0);
        assert!((e.ms_per_prompt_token - 3.0).abs() < 1e-9, "{e:?}");
        assert_eq!(e.ms_per_output_token, Estimates::PRIOR.ms_per_output_token);
        assert!((99..=100).contains(&e.prompt_tokens_within(Duration::from_millis(300))));
    }
}
