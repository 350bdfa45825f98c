//! Anytime reranking: candidates are scored by the cross-encoder in small
//! batches, best-first by retrieval rank, until the `rerank` budget runs
//! out. What was scored is reordered by a blend of the cross-encoder score
//! and the retrieval score (each z-scored over the scored candidates); the
//! rest keep their retrieval order after them.

use crate::budget::{Done, RequestBudget};
use ragtime_core::{Outcome, Passage, Reranker, Stage};

/// The cross-encoder's weight in the blend by default, chosen on the SciFact
/// train queries (`ragtime-bench rerank`).
pub const DEFAULT_WEIGHT: f32 = 0.5;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RerankParams {
    /// Candidates considered (best-first by retrieval rank).
    pub depth: usize,
    /// Pairs per model call: the granularity of "anytime".
    pub batch: usize,
    /// Weight of the cross-encoder in the blend (0 = retrieval order,
    /// 1 = cross-encoder order).
    pub weight: f32,
}

/// The text a cross-encoder sees for a hit (title and section, then the
/// chunk).
pub fn passage(hit: &Passage) -> String {
    let heading = hit.chunk.heading();
    if heading.is_empty() {
        hit.chunk.text.clone()
    } else {
        format!("{heading} {}", hit.chunk.text)
    }
}

fn zscores(v: &[f32]) -> Vec<f32> {
    let n = v.len().max(1) as f32;
    let mean = v.iter().sum::<f32>() / n;
    let sd = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n).sqrt();
    v.iter()
        .map(|x| if sd > 0.0 { (x - mean) / sd } else { 0.0 })
        .collect()
}

/// Reorders the first `ce.len()` hits by `weight·z(ce) + (1−weight)·z(retrieval)`;
/// the others keep their order after them.
pub fn blend(mut hits: Vec<Passage>, ce: &[f32], weight: f32) -> Vec<Passage> {
    let n = ce.len().min(hits.len());
    if n < 2 {
        return hits;
    }
    let rest = hits.split_off(n);
    let zc = zscores(&ce[..n]);
    let zr = zscores(&hits.iter().map(|h| h.score).collect::<Vec<_>>());
    let mut scored: Vec<(f32, usize, Passage)> = hits
        .into_iter()
        .enumerate()
        .map(|(i, h)| (weight * zc[i] + (1.0 - weight) * zr[i], i, h))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().map(|(_, _, h)| h).chain(rest).collect()
}

/// Runs the `rerank` stage under `budget` and returns the hits reordered.
/// Returns how many candidates were scored.
pub async fn rerank(
    budget: &RequestBudget,
    model: &dyn Reranker,
    query: &str,
    hits: Vec<Passage>,
    params: RerankParams,
) -> (Vec<Passage>, usize) {
    if hits.is_empty() {
        budget.skip(Stage::Rerank, "no passages");
        return (hits, 0);
    }
    let depth = params.depth.min(hits.len());
    let texts: Vec<String> = hits[..depth].iter().map(passage).collect();
    let run = budget
        .run(Stage::Rerank, |ctx| async move {
            let mut scores: Vec<f32> = Vec::with_capacity(depth);
            for batch in texts.chunks(params.batch.max(1)) {
                scores.extend(model.score(query, batch.to_vec(), ctx.cancel()).await?);
                ctx.keep(
                    scores.clone(),
                    format!("scored {} of {depth}", scores.len()),
                );
            }
            Ok(Done::Full(scores))
        })
        .await;
    match (run.outcome, run.value) {
        (Outcome::Ok | Outcome::Partial, Some(scores)) => {
            let n = scores.len();
            (blend(hits, &scores, params.weight), n)
        }
        _ => (hits, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn hit(id: i64, score: f32) -> Passage {
        let c = ragtime_testkit::chunk(id, &format!("d{id}"), "", "", serde_json::json!({}));
        Passage {
            chunk: Arc::new(c),
            score,
        }
    }

    fn ids(h: &[Passage]) -> Vec<i64> {
        h.iter().map(|h| h.chunk.chunk_id).collect()
    }

    #[test]
    fn only_the_scored_prefix_moves() {
        let hits = vec![
            hit(1, 0.9),
            hit(2, 0.8),
            hit(3, 0.7),
            hit(4, 0.6),
            hit(5, 0.5),
        ];
        // Cross-encoder alone (weight 1): 3 > 2 > 1 among the scored three.
        assert_eq!(
            ids(&blend(hits.clone(), &[0.1, 0.5, 0.9], 1.0)),
            [3, 2, 1, 4, 5]
        );
        // Retrieval alone (weight 0): order unchanged.
        assert_eq!(
            ids(&blend(hits.clone(), &[0.1, 0.5, 0.9], 0.0)),
            [1, 2, 3, 4, 5]
        );
        // Nothing or one scored: unchanged.
        assert_eq!(ids(&blend(hits.clone(), &[], 0.5)), [1, 2, 3, 4, 5]);
        assert_eq!(ids(&blend(hits, &[3.0], 0.5)), [1, 2, 3, 4, 5]);
    }

    #[test]
    fn the_blend_weighs_both_signals() {
        // Retrieval strongly prefers 1; the cross-encoder mildly prefers 2.
        let hits = vec![hit(1, 1.0), hit(2, 0.0), hit(3, 0.0)];
        let ce = [0.0, 1.0, 0.0];
        assert_eq!(
            ids(&blend(hits.clone(), &ce, 0.5))[0],
            1,
            "ties of z-scores keep retrieval order"
        );
        assert_eq!(ids(&blend(hits, &ce, 0.8))[0], 2);
    }
}
