use std::collections::HashSet;
use std::time::Duration;

/// Percentile `p` (0–100) of durations, in milliseconds.
pub fn pct(v: &mut [Duration], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort();
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)].as_secs_f64() * 1000.0
}

/// nDCG@10 with binary relevance.
pub fn ndcg_at_10(ranked: &[&str], relevant: &HashSet<String>) -> f64 {
    if relevant.is_empty() {
        return 0.0;
    }
    let dcg: f64 = ranked
        .iter()
        .take(10)
        .enumerate()
        .filter(|(_, d)| relevant.contains(**d))
        .map(|(i, _)| 1.0 / ((i + 2) as f64).log2())
        .sum();
    let ideal: f64 = (0..relevant.len().min(10))
        .map(|i| 1.0 / ((i + 2) as f64).log2())
        .sum();
    dcg / ideal
}

pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 11) as f32 / (1u64 << 53) as f32
    }
    /// An exponential wait of mean `1 / rate` (Poisson arrivals).
    pub fn exponential(&mut self, rate: f64) -> f64 {
        let u = f64::from(self.unit()).clamp(1e-9, 1.0 - 1e-9);
        -(1.0 - u).ln() / rate
    }
    pub fn gauss(&mut self) -> f32 {
        let (u, v) = (self.unit().max(1e-9), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndcg_matches_hand_computed_values() {
        let rel: HashSet<String> = ["a".to_owned()].into();
        assert!((ndcg_at_10(&["a", "b"], &rel) - 1.0).abs() < 1e-12);
        assert!((ndcg_at_10(&["b", "a"], &rel) - 1.0 / 3f64.log2()).abs() < 1e-12);
        assert_eq!(ndcg_at_10(&["b"], &rel), 0.0);
    }
}
