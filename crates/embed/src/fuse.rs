//! Exact graph simplifications for the setup's BERT export, applied to both
//! the query (fp32) and the passage (int8) sessions at load time.
//!
//! The model in setup was exported by PyTorch's dynamo exporter, whose
//! graph ONNX Runtime's own fusions do not recognise in two places that
//! together cost about a third of an inference (profiled with ONNX
//! Runtime's profiler, batch 32 × 128 tokens):
//!
//! - **NaN guard after softmax.** `scaled_dot_product_attention` exports as
//!   `Where(IsNaN(Softmax(s)), 0, Softmax(s))`, two extra passes over every
//!   `[batch, heads, seq, seq]` attention matrix. A softmax row is NaN only
//!   when every key is masked; the embedder always feeds `[CLS]` with
//!   attention mask 1, so no row is ever fully masked and the guard is the
//!   identity. It is replaced by `Identity`, which ONNX Runtime removes.
//! - **Erf GELU.** `x * (0.5 * (1 + erf(x / √2)))` in an operand order
//!   ONNX Runtime's GELU fusion does not match: five element-wise passes
//!   over the widest activation (`[batch, seq, 1536]`). It is replaced by
//!   the contrib op `Gelu` (same erf formula), which ONNX Runtime then fuses
//!   with the bias before it into `BiasGelu`.
//!
//! Both rewrites compute the same function, so query vectors keep their
//! cosine ≥ 0.999 to the reference.

use crate::proto::*;

/// What [`simplify`] rewrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Simplified {
    pub nan_guards: usize,
    pub gelus: usize,
}

fn near(v: Option<f32>, want: f32) -> bool {
    v.is_some_and(|v| (v - want).abs() <= 1e-4 * want.abs().max(1.0))
}

/// The input of a two-input node that is not `value`, if `value` is one.
fn other<'a>(inputs: &[&'a str], value: &str) -> Option<&'a str> {
    match inputs {
        [a, b] if *a == value => Some(b),
        [a, b] if *b == value => Some(a),
        _ => None,
    }
}

/// The only node reading `value`, when it is `op(value, c)` (either order)
/// with `c` a scalar initializer equal to `want`: its index and output.
fn by_constant<'a>(g: &Graph<'a>, value: &str, op: &str, want: f32) -> Option<(usize, &'a str)> {
    let k = g.only_consumer(value, op)?;
    let n = g.node(k);
    near(other(&n.inputs, value).and_then(|c| g.scalar(c)), want).then(|| (k, n.outputs[0]))
}

/// `Where(IsNaN(s), c, s)` with `s` a softmax output → `Identity(s)`.
fn nan_guards(g: &mut Graph<'_>) -> usize {
    let mut count = 0;
    for k in 0..g.nodes.len() {
        let w = g.node(k);
        if w.op != "Where" || w.inputs.len() != 3 || g.edited(k) {
            continue;
        }
        let (cond, s, out, name) = (w.inputs[0], w.inputs[2], w.outputs[0], w.name);
        let Some(isnan) = g.produced_by(cond, "IsNaN") else {
            continue;
        };
        if g.node(isnan).inputs != [s] || g.uses(cond) != 1 || g.produced_by(s, "Softmax").is_none()
        {
            continue;
        }
        g.replace_node(k, node_bytes(name, "Identity", None, &[s], &[out]), false);
        g.drop_node(isnan);
        count += 1;
    }
    count
}

/// `Mul(x, Mul(0.5, Add(Erf(Div(x, √2)), 1)))` (operands in either order)
/// → `Gelu(x)`.
fn gelus(g: &mut Graph<'_>) -> usize {
    let mut count = 0;
    for k in 0..g.nodes.len() {
        let erf = g.node(k);
        if erf.op != "Erf" || erf.inputs.len() != 1 || g.edited(k) {
            continue;
        }
        let (erf_in, erf_out) = (erf.inputs[0], erf.outputs[0]);
        let Some(div) = g.produced_by(erf_in, "Div") else {
            continue;
        };
        let (x, sqrt2) = match g.node(div).inputs[..] {
            [x, c] => (x, c),
            _ => continue,
        };
        if !near(g.scalar(sqrt2), std::f32::consts::SQRT_2) || g.uses(erf_in) != 1 {
            continue;
        }
        let Some((add, add_out)) = by_constant(g, erf_out, "Add", 1.0) else {
            continue;
        };
        let Some((half, half_out)) = by_constant(g, add_out, "Mul", 0.5) else {
            continue;
        };
        let Some(mul) = g.only_consumer(half_out, "Mul") else {
            continue;
        };
        if other(&g.node(mul).inputs, half_out) != Some(x) {
            continue;
        }
        let (name, out) = (g.node(mul).name, g.node(mul).outputs[0]);
        let gelu = node_bytes(name, "Gelu", Some("com.microsoft"), &[x], &[out]);
        g.replace_node(mul, gelu, true);
        for d in [div, k, add, half] {
            g.drop_node(d);
        }
        count += 1;
    }
    count
}

/// Applies both simplifications; returns the model (unchanged when there
/// was nothing to rewrite) and what was rewritten.
pub fn simplify(model: &[u8]) -> Result<(Vec<u8>, Simplified), String> {
    let mut g = Graph::parse(model)?;
    let done = Simplified {
        nan_guards: nan_guards(&mut g),
        gelus: gelus(&mut g),
    };
    Ok((g.finish(), done))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar_init(name: &str, v: f32) -> Vec<u8> {
        let mut b = Vec::new();
        put_varint_field(&mut b, 2, 1); // FLOAT
        put_bytes(&mut b, 8, name.as_bytes());
        put_bytes(&mut b, 9, &v.to_le_bytes());
        b
    }

    fn model(nodes: &[Vec<u8>], inits: &[Vec<u8>]) -> Vec<u8> {
        let mut g = Vec::new();
        for n in nodes {
            put_bytes(&mut g, 1, n);
        }
        for i in inits {
            put_bytes(&mut g, 5, i);
        }
        let mut m = Vec::new();
        put_bytes(&mut m, 7, &g);
        m
    }

    fn n(op: &str, ins: &[&str], outs: &[&str]) -> Vec<u8> {
        node_bytes(None, op, None, ins, outs)
    }

    fn ops(model: &[u8]) -> Vec<String> {
        let g = Graph::parse(model).expect("graph");
        g.nodes
            .iter()
            .map(|(_, n)| format!("{}({})", n.op, n.inputs.join(",")))
            .collect()
    }

    fn gelu_graph(half: f32) -> Vec<u8> {
        model(
            &[
                n("Div", &["x", "r2"], &["d"]),
                n("Erf", &["d"], &["e"]),
                n("Add", &["e", "one"], &["a"]),
                n("Mul", &["h", "a"], &["m"]),
                n("Mul", &["x", "m"], &["y"]),
            ],
            &[
                scalar_init("r2", std::f32::consts::SQRT_2),
                scalar_init("one", 1.0),
                scalar_init("h", half),
            ],
        )
    }

    #[test]
    fn erf_gelu_becomes_one_node() {
        let (out, done) = simplify(&gelu_graph(0.5)).expect("simplify");
        assert_eq!(done.gelus, 1);
        assert_eq!(ops(&out), ["Gelu(x)"]);
        // The contrib domain is declared.
        assert!(out.windows(13).any(|w| w == b"com.microsoft"));
    }

    #[test]
    fn a_different_constant_is_not_a_gelu() {
        let m = gelu_graph(0.25);
        let (out, done) = simplify(&m).expect("simplify");
        assert_eq!(done, Simplified::default());
        assert_eq!(out, m, "unchanged byte for byte");
    }

    #[test]
    fn nan_guard_after_softmax_becomes_identity() {
        let m = model(
            &[
                n("Softmax", &["s"], &["p"]),
                n("IsNaN", &["p"], &["c"]),
                n("Where", &["c", "z", "p"], &["q"]),
                n("MatMul", &["q", "v"], &["o"]),
            ],
            &[scalar_init("z", 0.0)],
        );
        let (out, done) = simplify(&m).expect("simplify");
        assert_eq!(done.nan_guards, 1);
        assert_eq!(ops(&out), ["Softmax(s)", "Identity(p)", "MatMul(q,v)"]);
    }

    #[test]
    fn a_guard_on_anything_but_a_softmax_stays() {
        let m = model(
            &[
                n("Relu", &["s"], &["p"]),
                n("IsNaN", &["p"], &["c"]),
                n("Where", &["c", "z", "p"], &["q"]),
            ],
            &[scalar_init("z", 0.0)],
        );
        assert_eq!(simplify(&m).expect("simplify").1.nan_guards, 0);
    }
}
