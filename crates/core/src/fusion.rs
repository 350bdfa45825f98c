//! Fusing the rankings of several retrievers into one: reciprocal rank
//! fusion (Cormack, Clarke & Büttcher, 2009), weighted per retriever, or a
//! convex combination of min–max normalised scores.

use std::collections::HashMap;
use std::hash::Hash;

/// The constant from the RRF paper; larger values flatten the rank curve.
pub const RRF_K: f32 = 60.0;

/// How two rankings become one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fusion {
    /// `Σ wᵢ / (k + rankᵢ)` over the lists an item is in.
    Rrf { k: f32 },
    /// `Σ wᵢ · (sᵢ − minᵢ) / (maxᵢ − minᵢ)`: each list's scores scaled to
    /// 0–1, an item missing from a list scoring 0 there.
    Convex,
}

/// A fusion with each retriever's weight and the depth it contributes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusionParams {
    pub method: Fusion,
    pub dense_weight: f32,
    pub lexical_weight: f32,
    /// Candidates fetched from each retriever, at least (more when the
    /// request asks for more results).
    pub depth: usize,
}

impl FusionParams {
    /// Plain RRF with k = 60 and equal weights.
    pub const RRF: Self = Self {
        method: Fusion::Rrf { k: RRF_K },
        dense_weight: 1.0,
        lexical_weight: 1.0,
        depth: 50,
    };
}

/// Fuses two scored rankings (best first) by `params`; deterministic:
/// ties keep the order of first appearance (the dense list first).
pub fn fuse<T: Eq + Hash + Clone>(
    dense: &[(T, f32)],
    lexical: &[(T, f32)],
    params: &FusionParams,
) -> Vec<(T, f32)> {
    let lists = [
        (dense, params.dense_weight),
        (lexical, params.lexical_weight),
    ];
    match params.method {
        Fusion::Rrf { k } => accumulate(&lists, |_, rank, _| 1.0 / (k + rank as f32 + 1.0)),
        Fusion::Convex => {
            let ranges: Vec<(f32, f32)> = lists
                .iter()
                .map(|(l, _)| {
                    l.iter()
                        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), (_, s)| {
                            (lo.min(*s), hi.max(*s))
                        })
                })
                .collect();
            accumulate(&lists, |list, _, score| {
                let (lo, hi) = ranges[list];
                if hi > lo {
                    (score - lo) / (hi - lo)
                } else {
                    1.0
                }
            })
        }
    }
}

/// Sums `weight · contribution(list, rank, score)` per item.
fn accumulate<T: Eq + Hash + Clone>(
    lists: &[(&[(T, f32)], f32)],
    contribution: impl Fn(usize, usize, f32) -> f32,
) -> Vec<(T, f32)> {
    let mut scores: HashMap<T, (f32, usize)> = HashMap::new();
    let mut seen = 0usize;
    for (li, (list, weight)) in lists.iter().enumerate() {
        for (rank, (item, score)) in list.iter().enumerate() {
            let e = scores.entry(item.clone()).or_insert_with(|| {
                seen += 1;
                (0.0, seen)
            });
            e.0 += weight * contribution(li, rank, *score);
        }
    }
    let mut out: Vec<(T, f32, usize)> = scores.into_iter().map(|(t, (s, o))| (t, s, o)).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
    out.into_iter().map(|(t, s, _)| (t, s)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unscored<T: Copy>(items: &[T]) -> Vec<(T, f32)> {
        items.iter().map(|t| (*t, 0.0)).collect()
    }

    #[test]
    fn items_in_both_lists_rise_to_the_top() {
        let dense = unscored(&["a", "b", "c"]);
        let lexical = unscored(&["c", "d", "a"]);
        let fused = fuse(&dense, &lexical, &FusionParams::RRF);
        let order: Vec<_> = fused.iter().map(|(t, _)| *t).collect();
        assert_eq!(order, ["a", "c", "b", "d"]);
        assert!((fused[0].1 - (1.0 / 61.0 + 1.0 / 63.0)).abs() < 1e-6);
    }

    #[test]
    fn one_list_keeps_its_order_and_empty_is_empty() {
        let fused = fuse(&unscored(&[3, 1, 2]), &[], &FusionParams::RRF);
        assert_eq!(fused.iter().map(|x| x.0).collect::<Vec<_>>(), [3, 1, 2]);
        assert!(fuse::<u8>(&[], &[], &FusionParams::RRF).is_empty());
    }

    fn order(f: Vec<(&'static str, f32)>) -> Vec<&'static str> {
        f.into_iter().map(|(t, _)| t).collect()
    }

    #[test]
    fn weights_tip_the_balance_between_retrievers() {
        let dense = [("a", 0.9), ("b", 0.8)];
        let lexical = [("b", 12.0), ("a", 3.0)];
        let mut p = FusionParams::RRF;
        // Equal weights: a tie, broken by first appearance (dense first).
        assert_eq!(order(fuse(&dense, &lexical, &p)), ["a", "b"]);
        p.lexical_weight = 1.5;
        assert_eq!(order(fuse(&dense, &lexical, &p)), ["b", "a"]);
        // A smaller k makes the first rank count for more.
        let p = FusionParams {
            method: Fusion::Rrf { k: 1.0 },
            ..FusionParams::RRF
        };
        let f = fuse(&[("a", 1.0), ("b", 0.5)], &[("c", 1.0)], &p);
        assert!((f[0].1 - 0.5).abs() < 1e-6, "{f:?}");
    }

    #[test]
    fn convex_combination_scales_each_list_to_its_range() {
        let dense = [("a", 0.9), ("b", 0.5), ("c", 0.1)];
        let lexical = [("c", 30.0), ("b", 20.0), ("a", 10.0)];
        let p = FusionParams {
            method: Fusion::Convex,
            dense_weight: 0.6,
            lexical_weight: 0.4,
            depth: 50,
        };
        let f = fuse(&dense, &lexical, &p);
        // a: 0.6·1 + 0.4·0 = 0.6; b: 0.6·0.5 + 0.4·0.5 = 0.5; c: 0 + 0.4 = 0.4.
        assert_eq!(order(f.clone()), ["a", "b", "c"]);
        assert!((f[0].1 - 0.6).abs() < 1e-6 && (f[2].1 - 0.4).abs() < 1e-6);
        // One item alone in a list counts fully; a missing one counts 0.
        let f = fuse(&[("x", 5.0)], &[], &p);
        assert!((f[0].1 - 0.6).abs() < 1e-6);
    }
}
