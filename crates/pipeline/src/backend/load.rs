//! Adaptive degradation: as the backends fill up, new requests do less —
//! fewer passages (a shorter prompt prefills sooner), fewer output tokens
//! (a slot frees sooner), no reranking — and as load falls they get it all
//! back. The level is decided per request from the backends' load now; the
//! levels and their thresholds are configurable.

use crate::backend::Load;
use serde::{Deserialize, Serialize};

/// One step of degradation, taken when the load reaches both thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Level {
    /// Share of the backends' slots in use (0–1).
    pub utilisation: f64,
    /// Requests waiting per slot.
    pub queue_per_slot: f64,
    /// At most this many passages in the prompt.
    pub top_k: usize,
    /// At most this many output tokens.
    pub max_tokens: u32,
    /// Whether the cross-encoder still reranks.
    pub rerank: bool,
}

/// The levels, lightest first (level 0, not listed, is no degradation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Levels(pub Vec<Level>);

impl Default for Levels {
    fn default() -> Self {
        Self(vec![
            // Every slot busy: drop reranking, trim the prompt and answer.
            Level {
                utilisation: 1.0,
                queue_per_slot: 0.0,
                top_k: 3,
                max_tokens: 192,
                rerank: false,
            },
            // A queue forms.
            Level {
                utilisation: 1.0,
                queue_per_slot: 0.5,
                top_k: 2,
                max_tokens: 128,
                rerank: false,
            },
            // The queue is long.
            Level {
                utilisation: 1.0,
                queue_per_slot: 1.5,
                top_k: 1,
                max_tokens: 96,
                rerank: false,
            },
        ])
    }
}

/// What a request may do at its level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// 0: no degradation.
    pub level: usize,
    pub top_k: Option<usize>,
    pub max_tokens: Option<u32>,
    pub rerank: bool,
}

impl Levels {
    /// The heaviest level whose thresholds `load` reaches.
    pub fn shape(&self, load: Load) -> Shape {
        let reached = self.0.iter().enumerate().rfind(|(_, l)| {
            load.utilisation >= l.utilisation && load.queue_per_slot >= l.queue_per_slot
        });
        match reached {
            None => Shape {
                level: 0,
                top_k: None,
                max_tokens: None,
                rerank: true,
            },
            Some((i, l)) => Shape {
                level: i + 1,
                top_k: Some(l.top_k),
                max_tokens: Some(l.max_tokens),
                rerank: l.rerank,
            },
        }
    }

    /// Checks the levels: thresholds not decreasing, sizes positive.
    pub fn validate(&self) -> Result<(), String> {
        for (i, w) in self.0.windows(2).enumerate() {
            if w[1].utilisation < w[0].utilisation || w[1].queue_per_slot < w[0].queue_per_slot {
                return Err(format!(
                    "level {} has lower thresholds than level {}",
                    i + 2,
                    i + 1
                ));
            }
        }
        if let Some((i, _)) = self
            .0
            .iter()
            .enumerate()
            .find(|(_, l)| l.top_k == 0 || l.max_tokens == 0)
        {
            return Err(format!(
                "level {}: top_k and max_tokens must be at least 1",
                i + 1
            ));
        }
        Ok(())
    }
}

impl Shape {
    /// The detail a report gives of it.
    pub fn describe(&self) -> Option<String> {
        (self.level > 0).then(|| {
            format!(
                "load level {}: at most {} passages and {} output tokens{}",
                self.level,
                self.top_k.unwrap_or(0),
                self.max_tokens.unwrap_or(0),
                if self.rerank { "" } else { ", no reranking" }
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(u: f64, q: f64) -> Load {
        Load {
            utilisation: u,
            queue_per_slot: q,
        }
    }

    #[test]
    fn the_level_rises_with_the_load_and_falls_back() {
        let l = Levels::default();
        assert_eq!(l.validate(), Ok(()));
        assert_eq!(l.shape(load(0.5, 0.0)).level, 0);
        assert!(l.shape(load(0.5, 0.0)).rerank);
        assert_eq!(l.shape(load(1.0, 0.0)).level, 1);
        assert!(!l.shape(load(1.0, 0.0)).rerank);
        assert_eq!(l.shape(load(1.0, 1.0)).top_k, Some(2));
        assert_eq!(l.shape(load(1.0, 4.0)).level, 3);
        assert_eq!(l.shape(load(0.5, 0.0)).level, 0, "back when the load falls");
        let bad = Levels(vec![l.0[1], l.0[0]]);
        assert!(bad.validate().is_err());
    }
}
