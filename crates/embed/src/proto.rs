//! Just enough of the protobuf wire format to rewrite ONNX graphs: fields
//! are parsed lazily and every field a rewrite does not touch is copied
//! byte for byte (no ONNX or protobuf crate).

use std::collections::HashMap;

/// One protobuf field: its number and its raw value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value<'a> {
    Varint(u64),
    Fixed64(&'a [u8]),
    Bytes(&'a [u8]),
    Fixed32(&'a [u8]),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Field<'a> {
    pub num: u64,
    pub value: Value<'a>,
}

pub(crate) fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos).ok_or("truncated varint")?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint too long".into())
}

pub(crate) fn take<'a>(buf: &'a [u8], pos: &mut usize, n: usize) -> Result<&'a [u8], String> {
    let end = pos.checked_add(n).filter(|&e| e <= buf.len());
    let end = end.ok_or("truncated field")?;
    let s = &buf[*pos..end];
    *pos = end;
    Ok(s)
}

pub(crate) fn parse(buf: &[u8]) -> Result<Vec<Field<'_>>, String> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        let key = read_varint(buf, &mut pos)?;
        let value = match key & 7 {
            0 => Value::Varint(read_varint(buf, &mut pos)?),
            1 => Value::Fixed64(take(buf, &mut pos, 8)?),
            2 => {
                let n = usize::try_from(read_varint(buf, &mut pos)?).map_err(|e| e.to_string())?;
                Value::Bytes(take(buf, &mut pos, n)?)
            }
            5 => Value::Fixed32(take(buf, &mut pos, 4)?),
            w => return Err(format!("unsupported wire type {w}")),
        };
        out.push(Field {
            num: key >> 3,
            value,
        });
    }
    Ok(out)
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_field(out: &mut Vec<u8>, f: &Field<'_>) {
    let wire = match f.value {
        Value::Varint(_) => 0,
        Value::Fixed64(_) => 1,
        Value::Bytes(_) => 2,
        Value::Fixed32(_) => 5,
    };
    put_varint(out, (f.num << 3) | wire);
    match f.value {
        Value::Varint(v) => put_varint(out, v),
        Value::Bytes(b) => {
            put_varint(out, b.len() as u64);
            out.extend_from_slice(b);
        }
        Value::Fixed64(b) | Value::Fixed32(b) => out.extend_from_slice(b),
    }
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, num: u64, b: &[u8]) {
    put_field(
        out,
        &Field {
            num,
            value: Value::Bytes(b),
        },
    );
}

pub(crate) fn put_varint_field(out: &mut Vec<u8>, num: u64, v: u64) {
    put_field(
        out,
        &Field {
            num,
            value: Value::Varint(v),
        },
    );
}

pub(crate) fn strings<'a>(fields: &[Field<'a>], num: u64) -> Vec<&'a str> {
    fields
        .iter()
        .filter(|f| f.num == num)
        .filter_map(|f| match f.value {
            Value::Bytes(b) => std::str::from_utf8(b).ok(),
            _ => None,
        })
        .collect()
}

// Field numbers from onnx.proto.
pub(crate) const MODEL_GRAPH: u64 = 7;
pub(crate) const MODEL_OPSET: u64 = 8;
pub(crate) const GRAPH_NODE: u64 = 1;
pub(crate) const GRAPH_INIT: u64 = 5;
pub(crate) const NODE_IN: u64 = 1;
pub(crate) const NODE_OUT: u64 = 2;
pub(crate) const NODE_NAME: u64 = 3;
pub(crate) const NODE_OP: u64 = 4;
pub(crate) const NODE_ATTR: u64 = 5;
pub(crate) const NODE_DOMAIN: u64 = 7;
pub(crate) const GRAPH_INPUT: u64 = 11;
pub(crate) const GRAPH_OUTPUT: u64 = 12;
const ATTR_NAME: u64 = 1;
const ATTR_F: u64 = 2;
const ATTR_I: u64 = 3;
const ATTR_INTS: u64 = 8;
const ATTR_TYPE: u64 = 20;
pub(crate) const TENSOR_DIMS: u64 = 1;
pub(crate) const TENSOR_TYPE: u64 = 2;
pub(crate) const TENSOR_NAME: u64 = 8;
pub(crate) const FLOAT: u64 = 1;
pub(crate) const INT8: u64 = 3;

pub(crate) struct Node<'a> {
    pub inputs: Vec<&'a str>,
    pub outputs: Vec<&'a str>,
    pub name: Option<&'a str>,
    pub op: &'a str,
}

pub(crate) fn node<'a>(bytes: &'a [u8]) -> Result<Node<'a>, String> {
    let f = parse(bytes)?;
    Ok(Node {
        inputs: strings(&f, NODE_IN),
        outputs: strings(&f, NODE_OUT),
        name: strings(&f, NODE_NAME).first().copied(),
        op: strings(&f, NODE_OP).first().copied().unwrap_or(""),
    })
}

pub(crate) struct Tensor<'a> {
    pub fields: Vec<Field<'a>>,
    pub dims: Vec<u64>,
    pub dtype: u64,
}

pub(crate) fn tensor<'a>(bytes: &'a [u8]) -> Result<(&'a str, Tensor<'a>), String> {
    let fields = parse(bytes)?;
    let dims = varints(&fields, TENSOR_DIMS)?;
    let dtype = fields
        .iter()
        .find_map(|f| match (f.num, &f.value) {
            (TENSOR_TYPE, Value::Varint(v)) => Some(*v),
            _ => None,
        })
        .unwrap_or(0);
    let name = strings(&fields, TENSOR_NAME).first().copied().unwrap_or("");
    Ok((
        name,
        Tensor {
            fields,
            dims,
            dtype,
        },
    ))
}

/// The tensor with its dims replaced by `dims`.
pub(crate) fn with_dims(t: &Tensor<'_>, dims: &[u64]) -> Vec<u8> {
    let mut packed = Vec::new();
    for &d in dims {
        put_varint(&mut packed, d);
    }
    let mut out = Vec::new();
    put_bytes(&mut out, TENSOR_DIMS, &packed);
    for f in t.fields.iter().filter(|f| f.num != TENSOR_DIMS) {
        put_field(&mut out, f);
    }
    out
}

const TENSOR_FLOAT_DATA: u64 = 4;
const TENSOR_RAW_DATA: u64 = 9;

const TENSOR_INT64_DATA: u64 = 7;
const INT64: u64 = 7;

/// The values of a repeated varint field (tensor dims, int64 data, ints
/// attributes), packed or not.
fn varints(fields: &[Field<'_>], num: u64) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for f in fields.iter().filter(|f| f.num == num) {
        match f.value {
            Value::Varint(v) => out.push(v),
            Value::Bytes(packed) => {
                let mut p = 0;
                while p < packed.len() {
                    out.push(read_varint(packed, &mut p)?);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// [`varints`] read as signed int64 values.
fn int64s(fields: &[Field<'_>], num: u64) -> Option<Vec<i64>> {
    let v = varints(fields, num).ok()?;
    Some(v.into_iter().map(|x| x as i64).collect())
}

impl Tensor<'_> {
    /// The values of an int64 tensor.
    pub fn ints(&self) -> Option<Vec<i64>> {
        if self.dtype != INT64 {
            return None;
        }
        let raw = self.fields.iter().find_map(|f| match (f.num, &f.value) {
            (TENSOR_RAW_DATA, Value::Bytes(b)) => Some(*b),
            _ => None,
        });
        let v = match raw {
            Some(b) => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
            None => int64s(&self.fields, TENSOR_INT64_DATA)?,
        };
        (v.len() as u64 == self.dims.iter().product::<u64>()).then_some(v)
    }

    /// The value of a one-element float tensor.
    pub fn scalar(&self) -> Option<f32> {
        if self.dtype != FLOAT || self.dims.iter().product::<u64>() != 1 {
            return None;
        }
        let four = |b: &[u8]| <[u8; 4]>::try_from(b).ok().map(f32::from_le_bytes);
        self.fields.iter().find_map(|f| match (f.num, &f.value) {
            (TENSOR_RAW_DATA | TENSOR_FLOAT_DATA, Value::Bytes(b)) => four(b),
            (TENSOR_FLOAT_DATA, Value::Fixed32(b)) => four(b),
            _ => None,
        })
    }
}

/// Where a node of an edited graph comes from: its graph field, and
/// which of the nodes inserted before that field it is (None: the field).
type Origin = (usize, Option<usize>);

fn own(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// A node's wire bytes.
pub(crate) fn node_bytes(
    name: Option<&str>,
    op: &str,
    domain: Option<&str>,
    inputs: &[&str],
    outputs: &[&str],
) -> Vec<u8> {
    let mut out = Vec::new();
    for i in inputs {
        put_bytes(&mut out, NODE_IN, i.as_bytes());
    }
    for o in outputs {
        put_bytes(&mut out, NODE_OUT, o.as_bytes());
    }
    if let Some(n) = name {
        put_bytes(&mut out, NODE_NAME, n.as_bytes());
    }
    put_bytes(&mut out, NODE_OP, op.as_bytes());
    if let Some(d) = domain {
        put_bytes(&mut out, NODE_DOMAIN, d.as_bytes());
    }
    out
}

/// `node` (wire bytes) with an int attribute added.
pub(crate) fn with_int_attr(mut node: Vec<u8>, name: &str, v: i64) -> Vec<u8> {
    let mut a = Vec::new();
    put_bytes(&mut a, ATTR_NAME, name.as_bytes());
    put_varint_field(&mut a, ATTR_I, v as u64);
    put_varint_field(&mut a, ATTR_TYPE, 2); // INT
    put_bytes(&mut node, NODE_ATTR, &a);
    node
}

/// `node` (wire bytes) with a float attribute added.
pub(crate) fn with_float_attr(mut node: Vec<u8>, name: &str, v: f32) -> Vec<u8> {
    let mut a = Vec::new();
    put_bytes(&mut a, ATTR_NAME, name.as_bytes());
    let bytes = v.to_le_bytes();
    put_field(
        &mut a,
        &Field {
            num: ATTR_F,
            value: Value::Fixed32(&bytes),
        },
    );
    put_varint_field(&mut a, ATTR_TYPE, 1); // FLOAT
    put_bytes(&mut node, NODE_ATTR, &a);
    node
}

/// A parsed model graph and the edits a rewrite makes to it.
pub(crate) struct Graph<'a> {
    model: &'a [u8],
    top: Vec<Field<'a>>,
    fields: Vec<Field<'a>>,
    /// Nodes in graph order, with their field index.
    pub nodes: Vec<(usize, Node<'a>)>,
    /// Initializers by name, with their field index.
    pub inits: HashMap<&'a str, (usize, Tensor<'a>)>,
    /// Output name → index into `nodes` of the node producing it.
    pub producer: HashMap<&'a str, usize>,
    /// Value name → indices into `nodes` of the nodes reading it.
    pub consumers: HashMap<&'a str, Vec<usize>>,
    /// Graph field index → replacement bytes (None: drop the field).
    edits: HashMap<usize, Option<Vec<u8>>>,
    /// Graph field index → new nodes written just before that field.
    inserted: HashMap<usize, Vec<Vec<u8>>>,
    contrib: bool,
}

impl<'a> Graph<'a> {
    pub fn parse(model: &'a [u8]) -> Result<Self, String> {
        let top = parse(model)?;
        let graph_bytes = top
            .iter()
            .find_map(|f| match (f.num, &f.value) {
                (MODEL_GRAPH, Value::Bytes(b)) => Some(*b),
                _ => None,
            })
            .ok_or("model has no graph")?;
        let fields = parse(graph_bytes)?;
        let mut nodes = Vec::new();
        let mut inits = HashMap::new();
        for (i, f) in fields.iter().enumerate() {
            match (f.num, &f.value) {
                (GRAPH_NODE, Value::Bytes(b)) => nodes.push((i, node(b)?)),
                (GRAPH_INIT, Value::Bytes(b)) => {
                    let (name, t) = tensor(b)?;
                    inits.insert(name, (i, t));
                }
                _ => {}
            }
        }
        let mut producer = HashMap::new();
        let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
        for (k, (_, n)) in nodes.iter().enumerate() {
            for o in &n.outputs {
                producer.insert(*o, k);
            }
            for i in &n.inputs {
                consumers.entry(i).or_default().push(k);
            }
        }
        Ok(Self {
            model,
            top,
            fields,
            nodes,
            inits,
            producer,
            consumers,
            edits: HashMap::new(),
            inserted: HashMap::new(),
            contrib: false,
        })
    }

    pub fn node(&self, k: usize) -> &Node<'a> {
        &self.nodes[k].1
    }

    /// How many nodes read `value`.
    pub fn uses(&self, value: &str) -> usize {
        self.consumers.get(value).map_or(0, Vec::len)
    }

    /// The node producing `value` when its op is `op` and the graph is not
    /// yet edited there.
    pub fn produced_by(&self, value: &str, op: &str) -> Option<usize> {
        let k = *self.producer.get(value)?;
        (self.node(k).op == op && !self.edited(k)).then_some(k)
    }

    /// The only node reading `value`, when its op is `op`.
    pub fn only_consumer(&self, value: &str, op: &str) -> Option<usize> {
        match self.consumers.get(value)?.as_slice() {
            [k] if self.node(*k).op == op && !self.edited(*k) => Some(*k),
            _ => None,
        }
    }

    /// The scalar value of initializer `name`.
    pub fn scalar(&self, name: &str) -> Option<f32> {
        self.inits.get(name)?.1.scalar()
    }

    pub fn edited(&self, k: usize) -> bool {
        self.edits.contains_key(&self.nodes[k].0)
    }

    /// Replaces node `k` with `bytes` (a contrib op when `contrib`).
    pub fn replace_node(&mut self, k: usize, bytes: Vec<u8>, contrib: bool) {
        self.edits.insert(self.nodes[k].0, Some(bytes));
        self.contrib |= contrib;
    }

    pub fn drop_node(&mut self, k: usize) {
        self.edits.insert(self.nodes[k].0, None);
    }

    /// Adds a node just before node `k` (which may itself be replaced).
    pub fn insert_before(&mut self, k: usize, bytes: Vec<u8>, contrib: bool) {
        self.inserted
            .entry(self.nodes[k].0)
            .or_default()
            .push(bytes);
        self.contrib |= contrib;
    }

    /// The attributes of node `k`, as fields, by name.
    fn attr(&self, k: usize, name: &str) -> Option<Vec<Field<'a>>> {
        let Value::Bytes(b) = self.fields[self.nodes[k].0].value else {
            return None;
        };
        let node = parse(b).ok()?;
        node.iter()
            .filter(|f| f.num == NODE_ATTR)
            .filter_map(|f| match f.value {
                Value::Bytes(a) => parse(a).ok(),
                _ => None,
            })
            .find(|a| strings(a, ATTR_NAME).first() == Some(&name))
    }

    /// Int attribute `name` of node `k`.
    pub fn attr_int(&self, k: usize, name: &str) -> Option<i64> {
        self.attr(k, name)?
            .iter()
            .find_map(|f| match (f.num, &f.value) {
                (ATTR_I, Value::Varint(v)) => Some(*v as i64),
                _ => None,
            })
    }

    /// Ints attribute `name` of node `k`.
    pub fn attr_ints(&self, k: usize, name: &str) -> Option<Vec<i64>> {
        int64s(&self.attr(k, name)?, ATTR_INTS)
    }

    /// The names of the graph's inputs or outputs (`GRAPH_INPUT`,
    /// `GRAPH_OUTPUT`).
    fn value_names(&self, num: u64) -> Vec<&'a str> {
        self.fields
            .iter()
            .filter(|f| f.num == num)
            .filter_map(|f| match f.value {
                Value::Bytes(b) => parse(b).ok(),
                _ => None,
            })
            .filter_map(|v| strings(&v, 1).first().copied())
            .collect()
    }

    /// Drops every node that no graph output depends on (after the edits so
    /// far); returns how many were dropped, or the first value a remaining
    /// node reads that nothing provides any more.
    pub fn prune(&mut self) -> Result<usize, String> {
        // The nodes as they will be written: (where it comes from: a graph
        // field, or the i-th node inserted before one; inputs; outputs).
        let mut live_nodes: Vec<(Origin, Vec<String>, Vec<String>)> = Vec::new();
        for (field, n) in &self.nodes {
            for (i, b) in self.inserted.get(field).into_iter().flatten().enumerate() {
                let n = node(b)?;
                live_nodes.push(((*field, Some(i)), own(&n.inputs), own(&n.outputs)));
            }
            match self.edits.get(field) {
                None => live_nodes.push(((*field, None), own(&n.inputs), own(&n.outputs))),
                Some(Some(b)) => {
                    let e = node(b)?;
                    live_nodes.push(((*field, None), own(&e.inputs), own(&e.outputs)));
                }
                Some(None) => {}
            }
        }
        let producer: HashMap<&str, usize> = live_nodes
            .iter()
            .enumerate()
            .flat_map(|(i, (_, _, outs))| outs.iter().map(move |o| (o.as_str(), i)))
            .collect();
        let mut want: Vec<&str> = self.value_names(GRAPH_OUTPUT);
        let mut live = vec![false; live_nodes.len()];
        while let Some(v) = want.pop() {
            if let Some(&i) = producer.get(v)
                && !live[i]
            {
                live[i] = true;
                want.extend(live_nodes[i].1.iter().map(String::as_str));
            }
        }
        let inputs: Vec<&str> = self.value_names(GRAPH_INPUT);
        for ((_, ins, _), _) in live_nodes.iter().zip(&live).filter(|(_, l)| **l) {
            let provided = |i: &str| {
                i.is_empty()
                    || producer.contains_key(i)
                    || self.inits.contains_key(i)
                    || inputs.contains(&i)
            };
            if let Some(missing) = ins.iter().find(|i| !provided(i)) {
                return Err(format!("nothing computes {missing}"));
            }
        }
        let dead: Vec<Origin> = live_nodes
            .iter()
            .zip(&live)
            .filter_map(|((at, _, _), &l)| (!l).then_some(*at))
            .collect();
        // Inserted nodes last first, so the indices still point right.
        for &(field, inserted) in dead.iter().rev() {
            match inserted {
                None => {
                    self.edits.insert(field, None);
                }
                Some(i) => {
                    self.inserted.get_mut(&field).map(|v| v.remove(i));
                }
            }
        }
        Ok(dead.len())
    }

    pub fn replace_init(&mut self, name: &str, bytes: Vec<u8>) {
        if let Some((field, _)) = self.inits.get(name) {
            self.edits.insert(*field, Some(bytes));
        }
    }

    /// The edited model (the input unchanged when nothing was edited).
    pub fn finish(self) -> Vec<u8> {
        if self.edits.is_empty() && self.inserted.is_empty() {
            return self.model.to_vec();
        }
        let mut graph = Vec::new();
        for (i, f) in self.fields.iter().enumerate() {
            for b in self.inserted.get(&i).into_iter().flatten() {
                put_bytes(&mut graph, GRAPH_NODE, b);
            }
            match self.edits.get(&i) {
                None => put_field(&mut graph, f),
                Some(None) => {}
                Some(Some(b)) => put_bytes(&mut graph, f.num, b),
            }
        }
        let has_ms_opset = self.top.iter().any(|f| match (f.num, &f.value) {
            (MODEL_OPSET, Value::Bytes(b)) => parse(b)
                .map(|o| strings(&o, 1).contains(&"com.microsoft"))
                .unwrap_or(false),
            _ => false,
        });
        let mut out = Vec::with_capacity(self.model.len());
        for f in &self.top {
            if f.num == MODEL_GRAPH {
                put_bytes(&mut out, MODEL_GRAPH, &graph);
            } else {
                put_field(&mut out, f);
            }
        }
        if self.contrib && !has_ms_opset {
            let mut opset = Vec::new();
            put_bytes(&mut opset, 1, b"com.microsoft");
            put_varint_field(&mut opset, 2, 1);
            put_bytes(&mut out, MODEL_OPSET, &opset);
        }
        out
    }
}
