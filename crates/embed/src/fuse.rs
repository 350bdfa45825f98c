//! Exact graph simplifications for the setup's BERT export, applied to both
//! the query (fp32) and the passage (int8) sessions at load time.
//!
//! The model in setup was exported by PyTorch's dynamo exporter, whose
//! graph ONNX Runtime's own fusions do not recognise in three places (the
//! first two cost about a third of an inference, profiled with ONNX
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
//! - **Attention.** Each layer's scaled dot-product attention is exported
//!   as about thirty nodes: per-head `Reshape`/`Transpose` views of the
//!   query, key and value projections, two scaling `Mul`s, `MatMul`, the
//!   additive padding mask, `Softmax`, the NaN guard above, `MatMul` and the
//!   views back, plus the shape arithmetic feeding the views. All of it is
//!   replaced by ONNX Runtime's contrib `MultiHeadAttention` over the three
//!   projections with `attention_mask` as key-padding mask (the same
//!   function: scale = the product of the two `Mul` constants, heads = width
//!   / head size read off the graph), and the nodes nothing reads any more
//!   are pruned. The graph shrinks from 355 to 193 nodes (283 to 121 for the int8
//!   passage graph); a short query's inference is about 8 % faster.
//!
//! Every rewrite computes the same function; a test checks the hidden
//! states of a padded batch against the exported graph.

use crate::proto::*;

/// What [`simplify`] rewrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Simplified {
    /// Attention subgraphs replaced by one `MultiHeadAttention` node.
    pub attentions: usize,
    /// NaN guards left outside a fused attention, made `Identity`.
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

/// Follows `value` up through `Reshape` and `Transpose` nodes read by
/// nothing else; returns the value they start from, the nodes passed and
/// the first `Reshape` (the one reading that value).
fn up_through_views<'a>(g: &Graph<'a>, mut value: &'a str) -> Option<(&'a str, Vec<usize>, usize)> {
    let mut passed = Vec::new();
    loop {
        let k = *g.producer.get(value)?;
        let n = g.node(k);
        if !matches!(n.op, "Reshape" | "Transpose") || g.edited(k) || !only_shape_reads(g, value) {
            let first = *passed.last()?;
            return (g.node(first).op == "Reshape").then_some((value, passed, first));
        }
        passed.push(k);
        value = n.inputs.first()?;
    }
}

/// Whether `value` has one reader apart from `Shape` nodes (which read
/// only its shape, and are pruned with the pattern's shape arithmetic).
fn only_shape_reads(g: &Graph<'_>, value: &str) -> bool {
    let readers = g.consumers.get(value).map_or(&[][..], Vec::as_slice);
    readers.iter().filter(|&&k| g.node(k).op != "Shape").count() == 1
}

/// `Transpose(perm = [0, 2, 1, 3])`: [batch, seq, heads, size] ↔
/// [batch, heads, seq, size].
fn heads_transpose(g: &Graph<'_>, k: usize) -> bool {
    g.node(k).op == "Transpose" && g.attr_ints(k, "perm").as_deref() == Some(&[0, 2, 1, 3])
}

/// A projection output `Add(MatMul(…), bias)`: the bias length.
fn projection_width(g: &Graph<'_>, value: &str) -> Option<u64> {
    let add = g.produced_by(value, "Add")?;
    g.node(add).inputs.iter().find_map(|i| {
        let t = &g.inits.get(i)?.1;
        (t.dtype == FLOAT && t.dims.len() == 1).then(|| t.dims[0])
    })
}

/// The head size a per-head `Reshape` splits into: the last entry of its
/// shape (an initializer, or a `Concat` ending in one).
fn head_size(g: &Graph<'_>, reshape: usize) -> Option<u64> {
    let shape = *g.node(reshape).inputs.get(1)?;
    let last = match g.inits.get(shape) {
        Some((_, t)) => *t.ints()?.last()?,
        None => {
            let concat = g.produced_by(shape, "Concat")?;
            let last = g.node(concat).inputs.last()?;
            *g.inits.get(last)?.1.ints()?.last()?
        }
    };
    u64::try_from(last).ok().filter(|&h| h > 0)
}

/// Whether `value` is computed from the graph input `input` (looking at
/// most 256 values up).
fn depends_on(g: &Graph<'_>, value: &str, input: &str) -> bool {
    let mut todo = vec![value];
    let mut seen = std::collections::HashSet::new();
    while let Some(v) = todo.pop() {
        if v == input {
            return true;
        }
        if seen.insert(v)
            && seen.len() <= 256
            && let Some(&k) = g.producer.get(v)
        {
            todo.extend(g.node(k).inputs.iter().copied());
        }
    }
    false
}

/// Scaled dot-product attention over per-head views of three projections,
/// with an additive key-padding mask from `attention_mask`, →
/// `MultiHeadAttention(q, k, v, key_padding_mask)` (contrib op).
///
/// Matched: `Softmax(axis −1)` of `Add(MatMul(Mul(q', a), Mul(k', b)),
/// Where(m, 0, −huge))`, where `q'` and `v'` are `Transpose([0, 2, 1, 3])`
/// of a per-head `Reshape` of a projection `Add(…, bias)`, `k'` is reached
/// from its projection through `Reshape`/`Transpose` views only, `m` is
/// computed from `attention_mask`; the softmax (or its NaN guard) is read
/// by `MatMul(·, v')`, then `Transpose([0, 2, 1, 3])` and `Reshape` back to
/// `[batch, seq, hidden]`. The scale is `a · b`; heads are the projection
/// width over the head size. Every intermediate is read only inside the
/// pattern. The replaced nodes are dropped; shape computations left
/// unread are pruned by [`simplify`].
fn attentions(g: &mut Graph<'_>) -> usize {
    let mut count = 0;
    for sm in 0..g.nodes.len() {
        if g.node(sm).op == "Softmax"
            && !g.edited(sm)
            && let Some(rewrite) = attention_at(g, sm)
        {
            let (drop, last, node) = rewrite;
            if count == 0 {
                let cast = node_bytes(
                    Some("ragtime_key_padding_mask"),
                    "Cast",
                    None,
                    &["attention_mask"],
                    &[MASK_I32],
                );
                g.insert_before(last, with_int_attr(cast, "to", 6), false); // INT32
            }
            g.replace_node(last, node, true);
            for k in drop {
                g.drop_node(k);
            }
            count += 1;
        }
    }
    count
}

const MASK_I32: &str = "ragtime_key_padding_mask_i32";

/// The nodes to drop, the node to replace and its replacement, when the
/// softmax `sm` sits in a scaled dot-product attention (see [`attentions`]).
fn attention_at(g: &Graph<'_>, sm: usize) -> Option<(Vec<usize>, usize, Vec<u8>)> {
    if g.attr_int(sm, "axis").unwrap_or(-1) != -1 {
        return None;
    }
    let (scores, probs) = (*g.node(sm).inputs.first()?, *g.node(sm).outputs.first()?);
    let add = g.produced_by(scores, "Add")?;
    let (qk, mask) = match g.node(add).inputs[..] {
        [a, b] if g.produced_by(a, "MatMul").is_some() => (a, b),
        [a, b] if g.produced_by(b, "MatMul").is_some() => (b, a),
        _ => return None,
    };
    let qk_mm = g.produced_by(qk, "MatMul")?;
    let wh = g.produced_by(mask, "Where")?;
    let (cond, zero, neg) = match g.node(wh).inputs[..] {
        [c, z, n] => (c, z, n),
        _ => return None,
    };
    if g.scalar(zero) != Some(0.0)
        || !g.scalar(neg).is_some_and(|v| v <= -1e30)
        || !depends_on(g, cond, "attention_mask")
        || g.uses(scores) != 1
        || g.uses(qk) != 1
    {
        return None;
    }
    // Query and key, each scaled by a constant.
    let mut scale = 1.0f32;
    let mut drop = vec![sm, add, qk_mm];
    let mut sides = Vec::new();
    for side in g.node(qk_mm).inputs.clone() {
        let mul = g.produced_by(side, "Mul")?;
        let (x, c) = match g.node(mul).inputs[..] {
            [x, c] if g.scalar(c).is_some() => (x, c),
            [c, x] if g.scalar(c).is_some() => (x, c),
            _ => return None,
        };
        if g.uses(side) != 1 {
            return None;
        }
        scale *= g.scalar(c)?;
        drop.push(mul);
        sides.push(x);
    }
    let (q_view, k_view) = (sides[0], sides[1]);
    let (q, q_passed, q_reshape) = up_through_views(g, q_view)?;
    if q_passed.len() != 2 || !heads_transpose(g, q_passed[0]) {
        return None;
    }
    let (k, k_passed, _) = up_through_views(g, k_view)?;
    // Softmax → (NaN guard) → MatMul with v'.
    let mut read = probs;
    let mut consumers = g.consumers.get(read)?.clone();
    if consumers.len() == 2 {
        // Where(IsNaN(p), 0, p).
        let isnan = *consumers.iter().find(|&&k| g.node(k).op == "IsNaN")?;
        let guard = *consumers.iter().find(|&&k| g.node(k).op == "Where")?;
        let gi = &g.node(guard).inputs;
        if gi.len() != 3
            || gi[0] != g.node(isnan).outputs[0]
            || gi[2] != read
            || g.uses(gi[0]) != 1
            || g.scalar(gi[1]) != Some(0.0)
        {
            return None;
        }
        drop.extend([isnan, guard]);
        read = *g.node(guard).outputs.first()?;
        consumers = g.consumers.get(read)?.clone();
    }
    let [pv_mm] = consumers[..] else {
        return None;
    };
    if g.node(pv_mm).op != "MatMul" || g.node(pv_mm).inputs.first() != Some(&read) {
        return None;
    }
    let (v, v_passed, _) = up_through_views(g, g.node(pv_mm).inputs.get(1)?)?;
    if v_passed.len() != 2 || !heads_transpose(g, v_passed[0]) {
        return None;
    }
    // Back to [batch, seq, hidden].
    let pv = g.node(pv_mm).outputs.first()?;
    let back = g.only_consumer(pv, "Transpose")?;
    if !heads_transpose(g, back) {
        return None;
    }
    let last = g.only_consumer(g.node(back).outputs.first()?, "Reshape")?;
    let out = *g.node(last).outputs.first()?;
    let width = projection_width(g, q)?;
    let head = head_size(g, q_reshape)?;
    if width % head != 0
        || projection_width(g, k) != Some(width)
        || projection_width(g, v) != Some(width)
    {
        return None;
    }
    drop.extend([pv_mm, back]);
    drop.extend(q_passed.iter().chain(&k_passed).chain(&v_passed));
    let node = node_bytes(
        g.node(sm).name,
        "MultiHeadAttention",
        Some("com.microsoft"),
        &[q, k, v, "", MASK_I32],
        &[out],
    );
    let node = with_int_attr(node, "num_heads", i64::try_from(width / head).ok()?);
    Some((drop, last, with_float_attr(node, "scale", scale)))
}

/// Applies the simplifications; returns the model (unchanged when there
/// was nothing to rewrite) and what was rewritten.
pub fn simplify(model: &[u8]) -> Result<(Vec<u8>, Simplified), String> {
    let mut g = Graph::parse(model)?;
    let mut done = Simplified {
        attentions: attentions(&mut g),
        ..Simplified::default()
    };
    if done.attentions > 0 && g.prune().is_err() {
        // Something outside the pattern still reads a value it computed:
        // leave attention as exported.
        g = Graph::parse(model)?;
        done.attentions = 0;
    }
    done.nan_guards = nan_guards(&mut g);
    done.gelus = gelus(&mut g);
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

    /// A graph reading input `x` and writing `output`.
    fn with_output(nodes: &[Vec<u8>], output: &str) -> Vec<u8> {
        let mut g = Vec::new();
        for n in nodes {
            put_bytes(&mut g, 1, n);
        }
        for (num, name) in [(GRAPH_INPUT, "x"), (GRAPH_OUTPUT, output)] {
            let mut value = Vec::new();
            put_bytes(&mut value, 1, name.as_bytes());
            put_bytes(&mut g, num, &value);
        }
        let mut m = Vec::new();
        put_bytes(&mut m, 7, &g);
        m
    }

    #[test]
    fn prune_drops_what_no_output_reads() {
        let m = with_output(
            &[
                n("Relu", &["x"], &["h"]),
                n("Shape", &["h"], &["dead"]),
                n("Relu", &["h"], &["y"]),
            ],
            "y",
        );
        let mut g = Graph::parse(&m).expect("graph");
        // An inserted node nothing reads goes too.
        g.insert_before(2, n("Neg", &["x"], &["unread"]), false);
        g.insert_before(2, n("Neg", &["h"], &["g"]), false);
        g.replace_node(2, n("Relu", &["g"], &["y"]), false);
        assert_eq!(g.prune(), Ok(2));
        assert_eq!(ops(&g.finish()), ["Relu(x)", "Neg(h)", "Relu(g)"]);
    }

    #[test]
    fn prune_refuses_a_read_of_a_value_nothing_computes() {
        let m = with_output(&[n("Relu", &["x"], &["h"]), n("Relu", &["h"], &["y"])], "y");
        let mut g = Graph::parse(&m).expect("graph");
        g.drop_node(0);
        assert_eq!(g.prune(), Err("nothing computes h".to_owned()));
    }

    #[test]
    fn attributes_and_int_tensors_read_back() {
        let softmax = with_int_attr(n("Softmax", &["s"], &["p"]), "axis", -1);
        let mha = with_float_attr(n("MultiHeadAttention", &["q"], &["o"]), "scale", 0.125);
        let mut shape = Vec::new();
        put_bytes(&mut shape, 1, &[4]); // dims [4], packed
        put_varint_field(&mut shape, 2, 7); // INT64
        put_bytes(&mut shape, 8, b"shape");
        let raw: Vec<u8> = [0i64, 0, -1, 32]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        put_bytes(&mut shape, 9, &raw);
        let m = model(&[softmax, mha], &[shape]);
        let g = Graph::parse(&m).expect("graph");
        assert_eq!(g.attr_int(0, "axis"), Some(-1));
        assert_eq!(g.attr_int(0, "perm"), None);
        assert_eq!(g.attr_int(1, "scale"), None, "a float is not an int");
        assert_eq!(g.inits["shape"].1.ints(), Some(vec![0, 0, -1, 32]));
        assert_eq!(g.inits["shape"].1.scalar(), None);
    }

    #[test]
    fn a_softmax_outside_an_attention_is_left_alone() {
        // Softmax of a plain input: no scores, no mask, no fusion.
        let m = model(
            &[
                n("Softmax", &["s"], &["p"]),
                n("MatMul", &["p", "v"], &["o"]),
            ],
            &[],
        );
        let (out, done) = simplify(&m).expect("simplify");
        assert_eq!(done, Simplified::default());
        assert_eq!(out, m);
    }
}
