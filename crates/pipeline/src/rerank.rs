//! Anytime reranking of documents: each candidate document's best passage
//! is scored by the cross-encoder in small batches, best-first by
//! retrieval rank, until the `rerank` budget runs out. What was scored is
//! reordered by a blend of the cross-encoder score and the retrieval score
//! (each z-scored over the scored candidates), each document keeping its
//! passages together; the rest keep their retrieval order after them.

use crate::budget::{Done, RequestBudget};
use ragtime_core::{Outcome, Passage, Reranker, Stage};

/// The cross-encoder's weight in the blend by default, chosen on the SciFact
/// train queries (`ragtime-bench rerank`).
pub const DEFAULT_WEIGHT: f32 = 0.4;

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

/// The order of the first `ce.len()` candidates by
/// `weight·z(ce) + (1−weight)·z(retrieval)`, the others after them.
fn blend_order(retrieval: &[f32], ce: &[f32], weight: f32) -> Vec<usize> {
    let n = ce.len().min(retrieval.len());
    if n < 2 {
        return (0..retrieval.len()).collect();
    }
    let zc = zscores(&ce[..n]);
    let zr = zscores(&retrieval[..n]);
    let mut scored: Vec<(f32, usize)> = (0..n)
        .map(|i| (weight * zc[i] + (1.0 - weight) * zr[i], i))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored
        .into_iter()
        .map(|(_, i)| i)
        .chain(n..retrieval.len())
        .collect()
}

/// Reorders the first `ce.len()` hits by `weight·z(ce) + (1−weight)·z(retrieval)`;
/// the others keep their order after them.
pub fn blend(hits: Vec<Passage>, ce: &[f32], weight: f32) -> Vec<Passage> {
    let order = blend_order(
        &hits.iter().map(|h| h.score).collect::<Vec<_>>(),
        ce,
        weight,
    );
    let mut slots: Vec<Option<Passage>> = hits.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}

/// Passages grouped by document, in order of each document's first.
pub fn documents(hits: Vec<Passage>) -> Vec<Vec<Passage>> {
    let mut groups: Vec<Vec<Passage>> = Vec::new();
    let mut at: std::collections::HashMap<i64, usize> = std::collections::HashMap::new();
    for h in hits {
        match at.get(&h.chunk.document_id) {
            Some(&i) => groups[i].push(h),
            None => {
                at.insert(h.chunk.document_id, groups.len());
                groups.push(vec![h]);
            }
        }
    }
    groups
}

/// [`blend`] for documents: each group ranks by its first passage's
/// scores and moves whole.
pub fn blend_documents(groups: Vec<Vec<Passage>>, ce: &[f32], weight: f32) -> Vec<Passage> {
    let heads: Vec<f32> = groups.iter().map(|g| g[0].score).collect();
    let order = blend_order(&heads, ce, weight);
    let mut slots: Vec<Option<Vec<Passage>>> = groups.into_iter().map(Some).collect();
    order
        .into_iter()
        .filter_map(|i| slots[i].take())
        .flatten()
        .collect()
}

/// Runs the `rerank` stage under `budget` and returns the hits reordered,
/// document by document (`params.depth` documents at most, each by its
/// best passage, the first of its group). Returns how many documents were
/// scored.
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
    let groups = documents(hits);
    let depth = params.depth.min(groups.len());
    let texts: Vec<String> = groups[..depth].iter().map(|g| passage(&g[0])).collect();
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
            (blend_documents(groups, &scores, params.weight), n)
        }
        _ => (groups.into_iter().flatten().collect(), 0),
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
    fn documents_move_with_their_passages() {
        let mut hits = vec![hit(1, 0.9), hit(2, 0.9), hit(3, 0.5), hit(4, 0.1)];
        // Chunks 1 and 2 are one document's; 3 and 4 one each.
        let mut c = (*hits[1].chunk).clone();
        c.document_id = 1;
        hits[1].chunk = Arc::new(c);
        let groups = documents(hits);
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [2, 1, 1]
        );
        // The cross-encoder puts document 3 first, then 1 (with its two
        // passages); document 4 was not scored and stays last.
        assert_eq!(
            ids(&blend_documents(groups, &[0.0, 2.0], 1.0)),
            [3, 1, 2, 4]
        );
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
