//! An index over a model's main graph for pattern matching, and the edits
//! a rewrite stages on it.
//!
//! A rewrite looks at the graph as loaded (who produces and who reads each
//! value) while it decides, and stages its changes: a node it replaces or
//! drops is marked edited, so no later pattern matches it again. The staged
//! [`Edits`] are applied to the model in one pass at the end, which is why
//! a rewrite can give up half-way (see [`Graph::prune`]) and leave the model
//! as it was.

use crate::proto::TensorProto;
use crate::proto::attribute_proto::AttributeType;
use crate::proto::tensor_proto::DataType;
use crate::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto};
use std::collections::HashMap;
use thiserror::Error;

/// The domain of ONNX Runtime's contrib operators.
pub const MS_DOMAIN: &str = "com.microsoft";

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GraphError {
    #[error("model has no graph")]
    NoGraph,
    /// A node that stays reads a value no node, initializer or graph input
    /// provides any more.
    #[error("nothing computes {0}")]
    Unprovided(String),
    #[error("edits staged on a graph of {staged} nodes applied to one of {found}")]
    OtherGraph { staged: usize, found: usize },
}

/// What happens to one node of the graph.
#[derive(Debug, Clone)]
enum NodeEdit {
    Keep,
    Drop,
    Replace(Box<NodeProto>),
}

/// The changes a rewrite made to a graph, to apply to its model.
#[derive(Debug)]
#[must_use = "edits do nothing until applied to the model"]
pub struct Edits {
    /// One per node of the graph, in order.
    nodes: Vec<NodeEdit>,
    /// Node index → new nodes written just before it.
    inserted: HashMap<usize, Vec<NodeProto>>,
    /// Initializer index → its replacement.
    inits: HashMap<usize, TensorProto>,
    /// Whether a node of ONNX Runtime's contrib domain was added.
    contrib: bool,
}

impl Edits {
    /// Whether applying these edits leaves the model as it is.
    pub fn is_empty(&self) -> bool {
        self.nodes.iter().all(|e| matches!(e, NodeEdit::Keep))
            && self.inserted.values().all(Vec::is_empty)
            && self.inits.is_empty()
    }

    /// Writes the edits into `model`, the model the [`Graph`] was built
    /// on, and declares the contrib opset when a contrib node was added.
    /// Nothing changes when the edits are empty.
    pub fn apply(mut self, model: &mut ModelProto) -> Result<(), GraphError> {
        if self.is_empty() {
            return Ok(());
        }
        let graph = model.graph.as_mut().ok_or(GraphError::NoGraph)?;
        if graph.node.len() != self.nodes.len() {
            return Err(GraphError::OtherGraph {
                staged: self.nodes.len(),
                found: graph.node.len(),
            });
        }
        let old = std::mem::take(&mut graph.node);
        graph.node.reserve(old.len());
        for (k, (node, edit)) in old.into_iter().zip(self.nodes).enumerate() {
            graph
                .node
                .extend(self.inserted.remove(&k).into_iter().flatten());
            match edit {
                NodeEdit::Keep => graph.node.push(node),
                NodeEdit::Replace(n) => graph.node.push(*n),
                NodeEdit::Drop => {}
            }
        }
        for (i, t) in self.inits {
            if let Some(slot) = graph.initializer.get_mut(i) {
                *slot = t;
            }
        }
        if self.contrib && !model.opset_import.iter().any(|o| o.domain() == MS_DOMAIN) {
            model.opset_import.push(OperatorSetIdProto {
                domain: Some(MS_DOMAIN.to_owned()),
                version: Some(1),
            });
        }
        Ok(())
    }
}

/// Where a node of the edited graph comes from.
#[derive(Debug, Clone, Copy)]
enum Origin {
    /// Node `k` of the graph (kept or replaced).
    Node(usize),
    /// The `i`-th node inserted before node `k`.
    Inserted(usize, usize),
}

/// A model's main graph, indexed by value name, with staged edits. The
/// indices are those of the graph as built: edits do not change them.
pub struct Graph<'m> {
    graph: &'m GraphProto,
    /// Initializer name → its index.
    inits: HashMap<&'m str, usize>,
    /// Value → the node producing it.
    producer: HashMap<&'m str, usize>,
    /// Value → the nodes reading it (a node once per input naming it).
    consumers: HashMap<&'m str, Vec<usize>>,
    edits: Edits,
}

impl<'m> Graph<'m> {
    pub fn new(model: &'m ModelProto) -> Result<Self, GraphError> {
        let graph = model.graph.as_ref().ok_or(GraphError::NoGraph)?;
        let mut producer = HashMap::new();
        let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
        for (k, n) in graph.node.iter().enumerate() {
            for o in &n.output {
                producer.insert(o.as_str(), k);
            }
            for i in &n.input {
                consumers.entry(i.as_str()).or_default().push(k);
            }
        }
        let inits = graph
            .initializer
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name(), i))
            .collect();
        Ok(Self {
            graph,
            inits,
            producer,
            consumers,
            edits: Edits {
                nodes: vec![NodeEdit::Keep; graph.node.len()],
                inserted: HashMap::new(),
                inits: HashMap::new(),
                contrib: false,
            },
        })
    }

    /// Number of nodes in the graph as built.
    pub fn len(&self) -> usize {
        self.graph.node.len()
    }

    pub fn is_empty(&self) -> bool {
        self.graph.node.is_empty()
    }

    /// Node `k` as built (not as edited).
    pub fn node(&self, k: usize) -> &'m NodeProto {
        &self.graph.node[k]
    }

    /// The node producing `value`.
    pub fn producer(&self, value: &str) -> Option<usize> {
        self.producer.get(value).copied()
    }

    /// The nodes reading `value`.
    pub fn consumers(&self, value: &str) -> &[usize] {
        self.consumers.get(value).map_or(&[], Vec::as_slice)
    }

    /// How many node inputs read `value`.
    pub fn uses(&self, value: &str) -> usize {
        self.consumers(value).len()
    }

    /// The node producing `value` when its op is `op` and it is not edited.
    pub fn produced_by(&self, value: &str, op: &str) -> Option<usize> {
        let k = self.producer(value)?;
        (self.node(k).op_type() == op && !self.edited(k)).then_some(k)
    }

    /// The only node reading `value`, when its op is `op` and it is not
    /// edited.
    pub fn only_consumer(&self, value: &str, op: &str) -> Option<usize> {
        match self.consumers(value) {
            [k] if self.node(*k).op_type() == op && !self.edited(*k) => Some(*k),
            _ => None,
        }
    }

    /// Initializer `name`.
    pub fn init(&self, name: &str) -> Option<&'m TensorProto> {
        let i = *self.inits.get(name)?;
        self.graph.initializer.get(i)
    }

    /// The value of initializer `name` when it is a one-element float.
    pub fn scalar(&self, name: &str) -> Option<f32> {
        self.init(name)?.scalar()
    }

    /// Whether node `k` is replaced or dropped.
    pub fn edited(&self, k: usize) -> bool {
        !matches!(self.edits.nodes[k], NodeEdit::Keep)
    }

    fn note_domain(&mut self, node: &NodeProto) {
        self.edits.contrib |= node.domain() == MS_DOMAIN;
    }

    /// Replaces node `k` with `node`.
    pub fn replace_node(&mut self, k: usize, node: NodeProto) {
        self.note_domain(&node);
        self.edits.nodes[k] = NodeEdit::Replace(Box::new(node));
    }

    pub fn drop_node(&mut self, k: usize) {
        self.edits.nodes[k] = NodeEdit::Drop;
    }

    /// Adds `node` just before node `k` (which may itself be replaced).
    pub fn insert_before(&mut self, k: usize, node: NodeProto) {
        self.note_domain(&node);
        self.edits.inserted.entry(k).or_default().push(node);
    }

    /// Replaces initializer `name` (nothing when there is none).
    pub fn replace_init(&mut self, name: &str, tensor: TensorProto) {
        if let Some(&i) = self.inits.get(name) {
            self.edits.inits.insert(i, tensor);
        }
    }

    /// Attribute `name` of node `k`.
    pub fn attr(&self, k: usize, name: &str) -> Option<&'m AttributeProto> {
        self.node(k).attribute.iter().find(|a| a.name() == name)
    }

    /// Int attribute `name` of node `k`.
    pub fn attr_int(&self, k: usize, name: &str) -> Option<i64> {
        self.attr(k, name)?.i
    }

    /// Ints attribute `name` of node `k`.
    pub fn attr_ints(&self, k: usize, name: &str) -> Option<&'m [i64]> {
        Some(&self.attr(k, name)?.ints)
    }

    /// Drops every node that no graph output depends on (after the edits so
    /// far) and returns how many; or, changing nothing, the first value a
    /// node that stays reads and nothing provides any more.
    pub fn prune(&mut self) -> Result<usize, GraphError> {
        // The nodes as they will be written.
        let mut nodes: Vec<(Origin, &NodeProto)> = Vec::with_capacity(self.len());
        for (k, edit) in self.edits.nodes.iter().enumerate() {
            let inserted = self.edits.inserted.get(&k).into_iter().flatten();
            nodes.extend(
                inserted
                    .enumerate()
                    .map(|(i, n)| (Origin::Inserted(k, i), n)),
            );
            match edit {
                NodeEdit::Keep => nodes.push((Origin::Node(k), &self.graph.node[k])),
                NodeEdit::Replace(n) => nodes.push((Origin::Node(k), n)),
                NodeEdit::Drop => {}
            }
        }
        let producer: HashMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .flat_map(|(i, (_, n))| n.output.iter().map(move |o| (o.as_str(), i)))
            .collect();
        let mut want: Vec<&str> = self.graph.output.iter().map(|v| v.name()).collect();
        let mut live = vec![false; nodes.len()];
        while let Some(v) = want.pop() {
            if let Some(&i) = producer.get(v)
                && !live[i]
            {
                live[i] = true;
                want.extend(nodes[i].1.input.iter().map(String::as_str));
            }
        }
        let provided = |v: &str| {
            v.is_empty()
                || producer.contains_key(v)
                || self.inits.contains_key(v)
                || self.graph.input.iter().any(|i| i.name() == v)
        };
        for ((_, n), _) in nodes.iter().zip(&live).filter(|(_, l)| **l) {
            if let Some(missing) = n.input.iter().find(|i| !provided(i)) {
                return Err(GraphError::Unprovided(missing.clone()));
            }
        }
        let dead: Vec<Origin> = nodes
            .iter()
            .zip(&live)
            .filter_map(|((at, _), &l)| (!l).then_some(*at))
            .collect();
        // Inserted nodes last first, so that the indices still point right.
        for &at in dead.iter().rev() {
            match at {
                Origin::Node(k) => self.edits.nodes[k] = NodeEdit::Drop,
                Origin::Inserted(k, i) => {
                    if let Some(v) = self.edits.inserted.get_mut(&k) {
                        v.remove(i);
                    }
                }
            }
        }
        Ok(dead.len())
    }

    /// The staged edits, to [`Edits::apply`] to the model.
    pub fn finish(self) -> Edits {
        self.edits
    }
}

/// A node `op(inputs) -> outputs` of the default domain, unnamed and
/// without attributes (set those with struct update syntax).
pub fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
    NodeProto {
        input: own(inputs),
        output: own(outputs),
        op_type: Some(op.to_owned()),
        ..NodeProto::default()
    }
}

/// An int attribute.
pub fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.to_owned()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..AttributeProto::default()
    }
}

/// A float attribute.
pub fn float_attr(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: Some(name.to_owned()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(v),
        ..AttributeProto::default()
    }
}

/// Reading the values of small constant tensors (shapes, scalars).
pub trait TensorValues {
    /// Whether the tensor's element type is `t`.
    fn is(&self, t: DataType) -> bool;
    /// The values of an int64 tensor (raw or typed data).
    fn ints(&self) -> Option<Vec<i64>>;
    /// The value of a one-element float tensor.
    fn scalar(&self) -> Option<f32>;
}

impl TensorValues for TensorProto {
    fn is(&self, t: DataType) -> bool {
        self.data_type == Some(t as i32)
    }

    fn ints(&self) -> Option<Vec<i64>> {
        if !self.is(DataType::Int64) {
            return None;
        }
        let v: Vec<i64> = match &self.raw_data {
            Some(raw) => raw
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
            None => self.int64_data.clone(),
        };
        let n = self.dims.iter().product::<i64>();
        (i64::try_from(v.len()).ok() == Some(n)).then_some(v)
    }

    fn scalar(&self) -> Option<f32> {
        if !self.is(DataType::Float) || self.dims.iter().product::<i64>() != 1 {
            return None;
        }
        match (&self.raw_data, &self.float_data[..]) {
            (Some(raw), _) => <[u8; 4]>::try_from(&raw[..]).ok().map(f32::from_le_bytes),
            (None, [v]) => Some(*v),
            (None, _) => None,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::proto::ValueInfoProto;

    /// A float scalar initializer.
    pub fn scalar_init(name: &str, v: f32) -> TensorProto {
        TensorProto {
            name: Some(name.to_owned()),
            data_type: Some(DataType::Float as i32),
            raw_data: Some(v.to_le_bytes().to_vec().into()),
            ..TensorProto::default()
        }
    }

    /// A model of `nodes` and `inits`, reading graph input `x` and
    /// writing `outputs`.
    pub fn model(nodes: Vec<NodeProto>, inits: Vec<TensorProto>, outputs: &[&str]) -> ModelProto {
        let value = |name: &str| ValueInfoProto {
            name: Some(name.to_owned()),
            ..ValueInfoProto::default()
        };
        ModelProto {
            graph: Some(GraphProto {
                node: nodes,
                initializer: inits,
                input: vec![value("x")],
                output: outputs.iter().map(|o| value(o)).collect(),
                ..GraphProto::default()
            }),
            ..ModelProto::default()
        }
    }

    /// `Op(input,…)` for each node of the model's graph.
    pub fn ops(model: &ModelProto) -> Vec<String> {
        model
            .graph
            .iter()
            .flat_map(|g| &g.node)
            .map(|n| format!("{}({})", n.op_type(), n.input.join(",")))
            .collect()
    }

    fn edited(m: &ModelProto, edit: impl FnOnce(&mut Graph<'_>)) -> ModelProto {
        let mut out = m.clone();
        let mut g = Graph::new(m).expect("graph");
        edit(&mut g);
        g.finish().apply(&mut out).expect("apply");
        out
    }

    #[test]
    fn prune_drops_what_no_output_reads() {
        let m = model(
            vec![
                node("Relu", &["x"], &["h"]),
                node("Shape", &["h"], &["dead"]),
                node("Relu", &["h"], &["y"]),
            ],
            vec![],
            &["y"],
        );
        let out = edited(&m, |g| {
            // An inserted node nothing reads goes too.
            g.insert_before(2, node("Neg", &["x"], &["unread"]));
            g.insert_before(2, node("Neg", &["h"], &["g"]));
            g.replace_node(2, node("Relu", &["g"], &["y"]));
            assert_eq!(g.prune(), Ok(2));
        });
        assert_eq!(ops(&out), ["Relu(x)", "Neg(h)", "Relu(g)"]);
        // No contrib node: no contrib opset.
        assert!(out.opset_import.is_empty());
    }

    #[test]
    fn prune_refuses_a_read_of_a_value_nothing_computes() {
        let m = model(
            vec![node("Relu", &["x"], &["h"]), node("Relu", &["h"], &["y"])],
            vec![],
            &["y"],
        );
        let mut g = Graph::new(&m).expect("graph");
        g.drop_node(0);
        assert_eq!(g.prune(), Err(GraphError::Unprovided("h".to_owned())));
    }

    #[test]
    fn a_contrib_node_declares_its_opset_once() {
        let m = model(vec![node("Relu", &["x"], &["y"])], vec![], &["y"]);
        let gelu = || NodeProto {
            domain: Some(MS_DOMAIN.to_owned()),
            ..node("Gelu", &["x"], &["y"])
        };
        let out = edited(&m, |g| g.replace_node(0, gelu()));
        assert_eq!(ops(&out), ["Gelu(x)"]);
        assert_eq!(out.opset_import.len(), 1);
        assert_eq!(out.opset_import[0].domain(), MS_DOMAIN);
        let again = edited(&out, |g| g.replace_node(0, gelu()));
        assert_eq!(again.opset_import, out.opset_import);
    }

    #[test]
    fn edits_apply_only_to_their_graph() {
        let m = model(vec![node("Relu", &["x"], &["y"])], vec![], &["y"]);
        let mut g = Graph::new(&m).expect("graph");
        g.drop_node(0);
        let edits = g.finish();
        let mut other = model(vec![], vec![], &[]);
        assert_eq!(
            edits.apply(&mut other),
            Err(GraphError::OtherGraph {
                staged: 1,
                found: 0
            })
        );
        assert_eq!(
            Graph::new(&ModelProto::default()).err(),
            Some(GraphError::NoGraph)
        );
    }

    #[test]
    fn attributes_and_int_tensors_read_back() {
        let softmax = NodeProto {
            attribute: vec![int_attr("axis", -1)],
            ..node("Softmax", &["s"], &["p"])
        };
        let mha = NodeProto {
            attribute: vec![float_attr("scale", 0.125)],
            ..node("MultiHeadAttention", &["q"], &["o"])
        };
        let shape = TensorProto {
            name: Some("shape".to_owned()),
            dims: vec![4],
            data_type: Some(DataType::Int64 as i32),
            raw_data: Some(
                [0i64, 0, -1, 32]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>()
                    .into(),
            ),
            ..TensorProto::default()
        };
        let typed = TensorProto {
            name: Some("typed".to_owned()),
            dims: vec![2],
            data_type: Some(DataType::Int64 as i32),
            int64_data: vec![7, -7],
            ..TensorProto::default()
        };
        let m = model(vec![softmax, mha], vec![shape, typed], &[]);
        let g = Graph::new(&m).expect("graph");
        assert_eq!(g.attr_int(0, "axis"), Some(-1));
        assert_eq!(g.attr_int(0, "perm"), None);
        assert_eq!(g.attr_int(1, "scale"), None, "a float is not an int");
        let init = |n| g.init(n).expect("init");
        assert_eq!(init("shape").ints(), Some(vec![0, 0, -1, 32]));
        assert_eq!(init("shape").scalar(), None);
        assert_eq!(init("typed").ints(), Some(vec![7, -7]));
        // dims that do not match the data: no values.
        let short = TensorProto {
            dims: vec![3],
            ..init("typed").clone()
        };
        assert_eq!(short.ints(), None);
        assert_eq!(scalar_init("c", 0.5).scalar(), Some(0.5));
    }
}
