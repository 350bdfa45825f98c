//! Exact graph simplifications for the setup's BERT export, applied to both
//! the query (fp32) and the passage (int8) graphs.
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
//! - **Attention.** Each layer's scaled dot-product attention is exported
//!   as about thirty nodes: per-head `Reshape`/`Transpose` views of the
//!   query, key and value projections, two scaling `Mul`s, `MatMul`, the
//!   additive padding mask, `Softmax`, the NaN guard above, `MatMul` and the
//!   views back, plus the shape arithmetic feeding the views. All of it is
//!   replaced by ONNX Runtime's contrib `MultiHeadAttention` over the three
//!   projections with `attention_mask` as key-padding mask (the same
//!   function: scale = the product of the two `Mul` constants, heads = width
//!   / head size read off the graph), and the nodes nothing reads any more
//!   are pruned. The graph shrinks from 355 to 193 nodes (283 to 121 for the
//!   int8 passage graph); a short query's inference is about 8 % faster.
//!
//! Every rewrite computes the same function; a test in `ragtime-embed`
//! checks the hidden states of a padded batch against the exported graph.

use crate::graph::{Graph, GraphError, MS_DOMAIN, TensorValues, float_attr, int_attr, node};
use crate::proto::tensor_proto::DataType;
use crate::proto::{ModelProto, NodeProto};
use serde::{Deserialize, Serialize};

/// What [`simplify`] rewrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
fn other<'a>(inputs: &'a [String], value: &str) -> Option<&'a str> {
    match inputs {
        [a, b] if a == value => Some(b),
        [a, b] if b == value => Some(a),
        _ => None,
    }
}

/// The first output of node `k` (empty when it has none).
fn out0<'m>(g: &Graph<'m>, k: usize) -> &'m str {
    g.node(k).output.first().map_or("", String::as_str)
}

/// A contrib-domain node named like the node it replaces.
fn contrib(name: &NodeProto, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        name: name.name.clone(),
        domain: Some(MS_DOMAIN.to_owned()),
        ..node(op, inputs, outputs)
    }
}

/// The only node reading `value`, when it is `op(value, c)` (either order)
/// with `c` a scalar initializer equal to `want`: its index and output.
fn by_constant<'m>(g: &Graph<'m>, value: &str, op: &str, want: f32) -> Option<(usize, &'m str)> {
    let k = g.only_consumer(value, op)?;
    let c = other(&g.node(k).input, value)?;
    near(g.scalar(c), want).then(|| (k, out0(g, k)))
}

/// `Where(IsNaN(s), c, s)` with `s` a softmax output → `Identity(s)`.
fn nan_guards(g: &mut Graph<'_>) -> usize {
    let mut count = 0;
    for k in 0..g.len() {
        let w = g.node(k);
        if w.op_type() != "Where" || w.input.len() != 3 || g.edited(k) {
            continue;
        }
        let (cond, s) = (&w.input[0], &w.input[2]);
        let Some(isnan) = g.produced_by(cond, "IsNaN") else {
            continue;
        };
        if g.node(isnan).input != [s.as_str()]
            || g.uses(cond) != 1
            || g.produced_by(s, "Softmax").is_none()
        {
            continue;
        }
        let identity = NodeProto {
            name: w.name.clone(),
            ..node("Identity", &[s], &[out0(g, k)])
        };
        g.replace_node(k, identity);
        g.drop_node(isnan);
        count += 1;
    }
    count
}

/// `Mul(x, Mul(0.5, Add(Erf(Div(x, √2)), 1)))` (operands in either order)
/// → `Gelu(x)`.
fn gelus(g: &mut Graph<'_>) -> usize {
    let mut count = 0;
    for k in 0..g.len() {
        let erf = g.node(k);
        if erf.op_type() != "Erf" || erf.input.len() != 1 || g.edited(k) {
            continue;
        }
        let (erf_in, erf_out) = (&erf.input[0], out0(g, k));
        let Some(div) = g.produced_by(erf_in, "Div") else {
            continue;
        };
        let [x, sqrt2] = &g.node(div).input[..] else {
            continue;
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
        if other(&g.node(mul).input, half_out) != Some(x) {
            continue;
        }
        let gelu = contrib(g.node(mul), "Gelu", &[x], &[out0(g, mul)]);
        g.replace_node(mul, gelu);
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
fn up_through_views<'m>(g: &Graph<'m>, mut value: &'m str) -> Option<(&'m str, Vec<usize>, usize)> {
    let mut passed = Vec::new();
    loop {
        let k = g.producer(value)?;
        let n = g.node(k);
        if !matches!(n.op_type(), "Reshape" | "Transpose")
            || g.edited(k)
            || !only_shape_reads(g, value)
        {
            let first = *passed.last()?;
            return (g.node(first).op_type() == "Reshape").then_some((value, passed, first));
        }
        passed.push(k);
        value = n.input.first()?;
    }
}

/// Whether `value` has one reader apart from `Shape` nodes (which read
/// only its shape, and are pruned with the pattern's shape arithmetic).
fn only_shape_reads(g: &Graph<'_>, value: &str) -> bool {
    let readers = g.consumers(value);
    readers
        .iter()
        .filter(|&&k| g.node(k).op_type() != "Shape")
        .count()
        == 1
}

/// `Transpose(perm = [0, 2, 1, 3])`: [batch, seq, heads, size] ↔
/// [batch, heads, seq, size].
fn heads_transpose(g: &Graph<'_>, k: usize) -> bool {
    g.node(k).op_type() == "Transpose" && g.attr_ints(k, "perm") == Some(&[0, 2, 1, 3])
}

/// A projection output `Add(MatMul(…), bias)`: the bias length.
fn projection_width(g: &Graph<'_>, value: &str) -> Option<i64> {
    let add = g.produced_by(value, "Add")?;
    g.node(add).input.iter().find_map(|i| match g.init(i)? {
        t if t.is(DataType::Float) => match t.dims[..] {
            [width] => Some(width),
            _ => None,
        },
        _ => None,
    })
}

/// The head size a per-head `Reshape` splits into: the last entry of its
/// shape (an initializer, or a `Concat` ending in one).
fn head_size(g: &Graph<'_>, reshape: usize) -> Option<i64> {
    let shape = g.node(reshape).input.get(1)?;
    let last = match g.init(shape) {
        Some(t) => *t.ints()?.last()?,
        None => {
            let concat = g.produced_by(shape, "Concat")?;
            let last = g.node(concat).input.last()?;
            *g.init(last)?.ints()?.last()?
        }
    };
    (last > 0).then_some(last)
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
            && let Some(k) = g.producer(v)
        {
            todo.extend(g.node(k).input.iter().map(String::as_str));
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
    for sm in 0..g.len() {
        if g.node(sm).op_type() != "Softmax" || g.edited(sm) {
            continue;
        }
        let Some(Attention { drop, last, node }) = attention_at(g, sm) else {
            continue;
        };
        if count == 0 {
            // The key-padding mask every layer reads, as int32.
            let cast = NodeProto {
                name: Some("ragtime_key_padding_mask".to_owned()),
                attribute: vec![int_attr("to", DataType::Int32 as i64)],
                ..crate::graph::node("Cast", &["attention_mask"], &[MASK_I32])
            };
            g.insert_before(last, cast);
        }
        g.replace_node(last, node);
        for k in drop {
            g.drop_node(k);
        }
        count += 1;
    }
    count
}

const MASK_I32: &str = "ragtime_key_padding_mask_i32";

/// One matched attention (see [`attentions`]).
struct Attention {
    /// The nodes to drop.
    drop: Vec<usize>,
    /// The node to replace (the final `Reshape`), and its replacement.
    last: usize,
    node: NodeProto,
}

/// The attention whose softmax is node `sm`, if it is one.
fn attention_at(g: &Graph<'_>, sm: usize) -> Option<Attention> {
    if g.attr_int(sm, "axis").unwrap_or(-1) != -1 {
        return None;
    }
    let (scores, probs) = (g.node(sm).input.first()?, out0(g, sm));
    let add = g.produced_by(scores, "Add")?;
    let (qk, mask) = match &g.node(add).input[..] {
        [a, b] if g.produced_by(a, "MatMul").is_some() => (a, b),
        [a, b] if g.produced_by(b, "MatMul").is_some() => (b, a),
        _ => return None,
    };
    let qk_mm = g.produced_by(qk, "MatMul")?;
    let wh = g.produced_by(mask, "Where")?;
    let [cond, zero, neg] = &g.node(wh).input[..] else {
        return None;
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
    for side in &g.node(qk_mm).input {
        let mul = g.produced_by(side, "Mul")?;
        let (x, c) = match &g.node(mul).input[..] {
            [x, c] if g.scalar(c).is_some() => (x, c),
            [c, x] if g.scalar(c).is_some() => (x, c),
            _ => return None,
        };
        if g.uses(side) != 1 {
            return None;
        }
        scale *= g.scalar(c)?;
        drop.push(mul);
        sides.push(x.as_str());
    }
    let [q_view, k_view] = sides[..] else {
        return None;
    };
    let (q, q_passed, q_reshape) = up_through_views(g, q_view)?;
    if q_passed.len() != 2 || !heads_transpose(g, q_passed[0]) {
        return None;
    }
    let (k, k_passed, _) = up_through_views(g, k_view)?;
    // Softmax → (NaN guard) → MatMul with v'.
    let mut read = probs;
    let mut consumers = g.consumers(read);
    if consumers.len() == 2 {
        // Where(IsNaN(p), 0, p).
        let isnan = *consumers
            .iter()
            .find(|&&k| g.node(k).op_type() == "IsNaN")?;
        let guard = *consumers
            .iter()
            .find(|&&k| g.node(k).op_type() == "Where")?;
        let gi = &g.node(guard).input;
        if gi.len() != 3
            || gi[0] != out0(g, isnan)
            || gi[2] != read
            || g.uses(&gi[0]) != 1
            || g.scalar(&gi[1]) != Some(0.0)
        {
            return None;
        }
        drop.extend([isnan, guard]);
        read = g.node(guard).output.first()?;
        consumers = g.consumers(read);
    }
    let [pv_mm] = consumers[..] else {
        return None;
    };
    if g.node(pv_mm).op_type() != "MatMul"
        || g.node(pv_mm).input.first().map(String::as_str) != Some(read)
    {
        return None;
    }
    let (v, v_passed, _) = up_through_views(g, g.node(pv_mm).input.get(1)?)?;
    if v_passed.len() != 2 || !heads_transpose(g, v_passed[0]) {
        return None;
    }
    // Back to [batch, seq, hidden].
    let back = g.only_consumer(g.node(pv_mm).output.first()?, "Transpose")?;
    if !heads_transpose(g, back) {
        return None;
    }
    let last = g.only_consumer(g.node(back).output.first()?, "Reshape")?;
    let out = g.node(last).output.first()?;
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
    let node = NodeProto {
        attribute: vec![
            int_attr("num_heads", width / head),
            float_attr("scale", scale),
        ],
        ..contrib(
            g.node(sm),
            "MultiHeadAttention",
            &[q, k, v, "", MASK_I32],
            &[out],
        )
    };
    Some(Attention { drop, last, node })
}

/// Applies the simplifications to `model` (left as it is when there is
/// nothing to rewrite) and says what was rewritten.
pub fn simplify(model: &mut ModelProto) -> Result<Simplified, GraphError> {
    let (edits, done) = {
        let mut g = Graph::new(model)?;
        let mut done = Simplified {
            attentions: attentions(&mut g),
            ..Simplified::default()
        };
        if done.attentions > 0 && g.prune().is_err() {
            // Something outside the pattern still reads a value it
            // computed: leave attention as exported.
            g = Graph::new(model)?;
            done.attentions = 0;
        }
        done.nan_guards = nan_guards(&mut g);
        done.gelus = gelus(&mut g);
        (g.finish(), done)
    };
    edits.apply(model)?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::tests::{model, ops, scalar_init};
    use crate::proto::TensorProto;

    fn n(op: &str, ins: &[&str], outs: &[&str]) -> NodeProto {
        node(op, ins, outs)
    }

    fn simplified(mut m: ModelProto) -> (ModelProto, Simplified) {
        let done = simplify(&mut m).expect("simplify");
        (m, done)
    }

    fn gelu_graph(half: f32) -> ModelProto {
        model(
            vec![
                n("Div", &["x", "r2"], &["d"]),
                n("Erf", &["d"], &["e"]),
                n("Add", &["e", "one"], &["a"]),
                n("Mul", &["h", "a"], &["m"]),
                n("Mul", &["x", "m"], &["y"]),
            ],
            vec![
                scalar_init("r2", std::f32::consts::SQRT_2),
                scalar_init("one", 1.0),
                scalar_init("h", half),
            ],
            &["y"],
        )
    }

    #[test]
    fn erf_gelu_becomes_one_node() {
        let (out, done) = simplified(gelu_graph(0.5));
        assert_eq!(done.gelus, 1);
        assert_eq!(ops(&out), ["Gelu(x)"]);
        // The contrib domain is declared.
        assert!(out.opset_import.iter().any(|o| o.domain() == MS_DOMAIN));
    }

    #[test]
    fn a_different_constant_is_not_a_gelu() {
        let m = gelu_graph(0.25);
        let (out, done) = simplified(m.clone());
        assert_eq!(done, Simplified::default());
        assert_eq!(out, m, "unchanged");
    }

    #[test]
    fn nan_guard_after_softmax_becomes_identity() {
        let m = model(
            vec![
                n("Softmax", &["s"], &["p"]),
                n("IsNaN", &["p"], &["c"]),
                n("Where", &["c", "z", "p"], &["q"]),
                n("MatMul", &["q", "v"], &["o"]),
            ],
            vec![scalar_init("z", 0.0)],
            &["o"],
        );
        let (out, done) = simplified(m);
        assert_eq!(done.nan_guards, 1);
        assert_eq!(ops(&out), ["Softmax(s)", "Identity(p)", "MatMul(q,v)"]);
        // Identity is a standard op: no contrib opset.
        assert!(out.opset_import.is_empty());
    }

    #[test]
    fn a_guard_on_anything_but_a_softmax_stays() {
        let m = model(
            vec![
                n("Relu", &["s"], &["p"]),
                n("IsNaN", &["p"], &["c"]),
                n("Where", &["c", "z", "p"], &["q"]),
            ],
            vec![scalar_init("z", 0.0)],
            &["q"],
        );
        assert_eq!(simplified(m).1.nan_guards, 0);
    }

    #[test]
    fn a_softmax_outside_an_attention_is_left_alone() {
        // Softmax of a plain input: no scores, no mask, no fusion.
        let m = model(
            vec![
                n("Softmax", &["s"], &["p"]),
                n("MatMul", &["p", "v"], &["o"]),
            ],
            vec![],
            &["o"],
        );
        let (out, done) = simplified(m.clone());
        assert_eq!(done, Simplified::default());
        assert_eq!(out, m);
    }

    /// One head-split attention as the dynamo exporter writes it, on
    /// projections `Add(MatMul(x, W), b)` of width 4 with head size 2.
    /// `extra` nodes are added, and `outputs` are the graph's.
    fn attention_graph(extra: &[NodeProto], outputs: &[&str]) -> ModelProto {
        let int64s = |name: &str, v: &[i64]| TensorProto {
            name: Some(name.to_owned()),
            dims: vec![v.len() as i64],
            data_type: Some(DataType::Int64 as i32),
            int64_data: v.to_vec(),
            ..TensorProto::default()
        };
        let bias = |name: &str| TensorProto {
            name: Some(name.to_owned()),
            dims: vec![4],
            data_type: Some(DataType::Float as i32),
            float_data: vec![0.0; 4],
            ..TensorProto::default()
        };
        let perm = |mut t: NodeProto| {
            t.attribute.push(AttributeProto {
                name: Some("perm".to_owned()),
                ints: vec![0, 2, 1, 3],
                ..AttributeProto::default()
            });
            t
        };
        let mut nodes = Vec::new();
        for p in ["q", "k", "v"] {
            let w = format!("w{p}");
            let b = format!("b{p}");
            let (mm, proj, heads, view) = (
                format!("{p}_mm"),
                format!("{p}_proj"),
                format!("{p}_heads"),
                format!("{p}_view"),
            );
            nodes.push(n("MatMul", &["x", &w], &[&mm]));
            nodes.push(n("Add", &[&mm, &b], &[&proj]));
            nodes.push(n("Reshape", &[&proj, "split"], &[&heads]));
            nodes.push(perm(n("Transpose", &[&heads], &[&view])));
        }
        nodes.extend([
            n("Mul", &["q_view", "a"], &["qs"]),
            n("Mul", &["k_view", "a"], &["ks"]),
            n("MatMul", &["qs", "ks"], &["qk"]),
            n("Cast", &["attention_mask"], &["m"]),
            n("Where", &["m", "zero", "neg"], &["bias"]),
            n("Add", &["qk", "bias"], &["scores"]),
            n("Softmax", &["scores"], &["p"]),
            n("IsNaN", &["p"], &["nan"]),
            n("Where", &["nan", "zero", "p"], &["pg"]),
            n("MatMul", &["pg", "v_view"], &["pv"]),
            perm(n("Transpose", &["pv"], &["back"])),
            n("Reshape", &["back", "merge"], &["y"]),
        ]);
        nodes.extend_from_slice(extra);
        let mut inits = vec![
            int64s("split", &[0, 0, 2, 2]),
            int64s("merge", &[0, 0, 4]),
            scalar_init("a", 0.5),
            scalar_init("zero", 0.0),
            scalar_init("neg", f32::MIN),
        ];
        for p in ["q", "k", "v"] {
            inits.push(bias(&format!("b{p}")));
            inits.push(TensorProto {
                name: Some(format!("w{p}")),
                ..bias("")
            });
        }
        let mut m = model(nodes, inits, outputs);
        if let Some(g) = m.graph.as_mut() {
            g.input.push(crate::proto::ValueInfoProto {
                name: Some("attention_mask".to_owned()),
                ..Default::default()
            });
        }
        m
    }

    use crate::proto::AttributeProto;

    #[test]
    fn an_exported_attention_becomes_multi_head_attention() {
        // The shape of a head view that nothing reads is pruned with it.
        let shape = n("Shape", &["q_heads"], &["unread"]);
        let (out, done) = simplified(attention_graph(&[shape], &["y"]));
        assert_eq!(
            done,
            Simplified {
                attentions: 1,
                ..Simplified::default()
            }
        );
        assert_eq!(
            ops(&out),
            [
                "MatMul(x,wq)",
                "Add(q_mm,bq)",
                "MatMul(x,wk)",
                "Add(k_mm,bk)",
                "MatMul(x,wv)",
                "Add(v_mm,bv)",
                "Cast(attention_mask)",
                "MultiHeadAttention(q_proj,k_proj,v_proj,,ragtime_key_padding_mask_i32)",
            ]
        );
        let graph = out.graph.as_ref().expect("graph");
        let mha = graph.node.last().expect("node");
        let g = Graph::new(&out).expect("graph");
        let k = g.len() - 1;
        assert_eq!(mha.domain(), MS_DOMAIN);
        assert_eq!(g.attr_int(k, "num_heads"), Some(2));
        assert_eq!(g.attr(k, "scale").and_then(|a| a.f), Some(0.25));
        assert_eq!(mha.output, ["y"]);
    }

    #[test]
    fn an_attention_whose_inside_is_read_elsewhere_stays() {
        // A second reader of the head products: no match.
        let relu = n("Relu", &["pv"], &["leak"]);
        // The shape of a head view feeding an output: matched, but pruning
        // finds a node that stays reading a dropped value, so it is undone.
        let shape = n("Shape", &["q_heads"], &["leak"]);
        for extra in [relu, shape] {
            let m = attention_graph(&[extra], &["y", "leak"]);
            let (out, done) = simplified(m.clone());
            // Not fused; the NaN guard alone still becomes an identity.
            let guard_only = Simplified {
                nan_guards: 1,
                ..Simplified::default()
            };
            assert_eq!(done, guard_only);
            assert_eq!(ops(&out).len(), ops(&m).len() - 1);
            assert!(ops(&out).contains(&"Identity(p)".to_owned()));
            assert!(out.opset_import.is_empty());
        }
    }
}
