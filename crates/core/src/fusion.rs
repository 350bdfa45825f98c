//! Reciprocal rank fusion (Cormack, Clarke & Büttcher, 2009).

use std::collections::HashMap;
use std::hash::Hash;

/// The constant from the RRF paper; larger values flatten the rank curve.
pub const RRF_K: f32 = 60.0;

/// Fuses ranked lists (best first) into one: each item scores
/// `Σ 1 / (k + rank)` over the lists it appears in (rank from 1). Ties keep
/// the order of first appearance, so the result is deterministic.
pub fn reciprocal_rank_fusion<T: Eq + Hash + Clone>(lists: &[Vec<T>], k: f32) -> Vec<(T, f32)> {
    let mut scores: HashMap<T, (f32, usize)> = HashMap::new();
    let mut seen = 0usize;
    for list in lists {
        for (rank, item) in list.iter().enumerate() {
            let e = scores.entry(item.clone()).or_insert_with(|| {
                seen += 1;
                (0.0, seen)
            });
            e.0 += 1.0 / (k + rank as f32 + 1.0);
        }
    }
    let mut out: Vec<(T, f32, usize)> = scores.into_iter().map(|(t, (s, o))| (t, s, o)).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
    out.into_iter().map(|(t, s, _)| (t, s)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_in_both_lists_rise_to_the_top() {
        let dense = vec!["a", "b", "c"];
        let lexical = vec!["c", "d", "a"];
        let fused = reciprocal_rank_fusion(&[dense, lexical], RRF_K);
        let order: Vec<_> = fused.iter().map(|(t, _)| *t).collect();
        assert_eq!(order, ["a", "c", "b", "d"]);
        assert!((fused[0].1 - (1.0 / 61.0 + 1.0 / 63.0)).abs() < 1e-6);
    }

    #[test]
    fn one_list_keeps_its_order_and_empty_is_empty() {
        let fused = reciprocal_rank_fusion(&[vec![3, 1, 2]], RRF_K);
        assert_eq!(fused.iter().map(|x| x.0).collect::<Vec<_>>(), [3, 1, 2]);
        assert!(reciprocal_rank_fusion::<u8>(&[], RRF_K).is_empty());
    }
}
