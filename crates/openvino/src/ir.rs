//! Writing OpenVINO IR (version 11): an XML graph of layers and edges whose constants
//! point into one binary blob.
//!
//! The C API cannot build graphs, so pyramid writes them as text. OpenVINO infers every
//! shape itself when it reads the model, so ports carry no dimensions here, only their element type. Constants are
//! not made per graph: the [`Blob`] is built once per model with every weight and every
//! small constant (axes, reshape patterns, scalars) any artifact needs, and graphs only
//! refer to them, so the blob is shared by all artifacts of a model without copying.

use std::collections::HashMap;
use std::fmt::Write;

/// IR element type names as OpenVINO spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Et {
    F32,
    F16,
    Bf16,
    I8,
    U8,
    I4,
    I64,
}

impl Et {
    fn name(self) -> &'static str {
        match self {
            Et::F32 => "f32",
            Et::F16 => "f16",
            Et::Bf16 => "bf16",
            Et::I8 => "i8",
            Et::U8 => "u8",
            Et::I4 => "i4",
            Et::I64 => "i64",
        }
    }
}

/// A constant stored in the blob.
#[derive(Debug, Clone)]
pub struct ConstRef {
    pub et: Et,
    pub shape: Vec<usize>,
    offset: usize,
    size: usize,
}

/// Every constant of a model's graphs, in one buffer OpenVINO reads in place.
#[derive(Debug, Default)]
pub struct Blob {
    pub bytes: Vec<u8>,
    consts: HashMap<String, ConstRef>,
}

/// Constants start on cache-line boundaries so plugins can use them in place.
const ALIGN: usize = 64;

impl Blob {
    /// Adds `bytes` (already in `et`'s layout) as constant `name`.
    pub fn add(&mut self, name: &str, et: Et, shape: &[usize], bytes: &[u8]) {
        let offset = self.bytes.len().next_multiple_of(ALIGN);
        self.bytes.resize(offset, 0);
        self.bytes.extend_from_slice(bytes);
        self.consts.insert(
            name.to_string(),
            ConstRef {
                et,
                shape: shape.to_vec(),
                offset,
                size: bytes.len(),
            },
        );
    }

    pub fn add_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add(name, Et::F32, shape, &bytes);
    }

    pub fn add_i64(&mut self, name: &str, values: &[i64]) {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add(name, Et::I64, &[values.len()], &bytes);
    }

    pub fn contains(&self, name: &str) -> bool {
        self.consts.contains_key(name)
    }

    pub fn get(&self, name: &str) -> &ConstRef {
        self.consts
            .get(name)
            .unwrap_or_else(|| panic!("graph refers to constant '{name}' missing from the blob"))
    }
}

/// An output port of a layer.
#[derive(Debug, Clone, Copy)]
pub struct Port {
    layer: usize,
    port: usize,
}

struct Layer {
    name: String,
    kind: &'static str,
    version: &'static str,
    data: String,
    n_inputs: usize,
    /// Tensor names of each output port (empty when unnamed).
    outputs: Vec<String>,
    /// Every op in pyramid's graphs computes in f32; only inputs and constants differ.
    output_precision: &'static str,
}

/// One graph under construction.
pub struct Graph<'b> {
    name: String,
    blob: &'b Blob,
    layers: Vec<Layer>,
    edges: Vec<(Port, usize, usize)>,
    /// Constants already placed, so a weight used twice is one layer.
    placed: HashMap<String, Port>,
}

fn precision(et: Et) -> &'static str {
    match et {
        Et::F32 => "FP32",
        Et::F16 => "FP16",
        Et::Bf16 => "BF16",
        Et::I8 => "I8",
        Et::U8 => "U8",
        Et::I4 => "I4",
        Et::I64 => "I64",
    }
}

fn dims(shape: &[usize]) -> String {
    shape
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl<'b> Graph<'b> {
    pub fn new(name: &str, blob: &'b Blob) -> Self {
        Self {
            name: name.to_string(),
            blob,
            layers: Vec::new(),
            edges: Vec::new(),
            placed: HashMap::new(),
        }
    }

    fn push(&mut self, layer: Layer, inputs: &[Port]) -> usize {
        let id = self.layers.len();
        for (i, &from) in inputs.iter().enumerate() {
            self.edges.push((from, id, i));
        }
        self.layers.push(layer);
        id
    }

    /// A graph input of fixed `shape`, bound by `name` at run time.
    pub fn parameter(&mut self, name: &str, et: Et, shape: &[usize]) -> Port {
        let layer = self.push(
            Layer {
                name: name.to_string(),
                kind: "Parameter",
                version: "opset1",
                data: format!(r#"shape="{}" element_type="{}""#, dims(shape), et.name()),
                n_inputs: 0,
                outputs: vec![name.to_string()],
                output_precision: precision(et),
            },
            &[],
        );
        Port { layer, port: 0 }
    }

    pub fn has_constant(&self, name: &str) -> bool {
        self.blob.contains(name)
    }

    /// The blob's constant `name`.
    pub fn constant(&mut self, name: &str) -> Port {
        if let Some(&port) = self.placed.get(name) {
            return port;
        }
        let c = self.blob.get(name);
        let layer = self.push(
            Layer {
                name: name.to_string(),
                kind: "Const",
                version: "opset1",
                data: format!(
                    r#"element_type="{}" shape="{}" offset="{}" size="{}""#,
                    c.et.name(),
                    dims(&c.shape),
                    c.offset,
                    c.size
                ),
                n_inputs: 0,
                outputs: vec![String::new()],
                output_precision: precision(c.et),
            },
            &[],
        );
        let port = Port { layer, port: 0 };
        self.placed.insert(name.to_string(), port);
        port
    }

    /// An operation with one output.
    pub fn op(
        &mut self,
        kind: &'static str,
        version: &'static str,
        data: &str,
        inputs: &[Port],
    ) -> Port {
        self.op_n(kind, version, data, inputs, 1)[0]
    }

    /// An operation with `n_outputs` outputs (Split, VariadicSplit).
    pub fn op_n(
        &mut self,
        kind: &'static str,
        version: &'static str,
        data: &str,
        inputs: &[Port],
        n_outputs: usize,
    ) -> Vec<Port> {
        let n_inputs = inputs.len();
        let layer = self.push(
            Layer {
                name: format!("{}_{}", kind.to_lowercase(), self.layers.len()),
                kind,
                version,
                data: data.to_string(),
                n_inputs,
                outputs: vec![String::new(); n_outputs],
                output_precision: "FP32",
            },
            inputs,
        );
        (0..n_outputs)
            .map(|i| Port {
                layer,
                port: n_inputs + i,
            })
            .collect()
    }

    /// Makes `port` a graph output named `name`.
    pub fn output(&mut self, port: Port, name: &str) {
        let layer = &mut self.layers[port.layer];
        layer.outputs[port.port - layer.n_inputs] = name.to_string();
        self.push(
            Layer {
                name: format!("{name}/result"),
                kind: "Result",
                version: "opset1",
                data: String::new(),
                n_inputs: 1,
                outputs: Vec::new(),
                output_precision: "FP32",
            },
            &[port],
        );
    }

    pub fn to_xml(&self) -> String {
        let mut x = String::with_capacity(self.layers.len() * 200);
        let _ = writeln!(x, r#"<?xml version="1.0"?>"#);
        let _ = writeln!(x, r#"<net name="{}" version="11">"#, self.name);
        x.push_str("<layers>\n");
        for (id, l) in self.layers.iter().enumerate() {
            let _ = write!(
                x,
                r#"<layer id="{id}" name="{}" type="{}" version="{}">"#,
                l.name, l.kind, l.version
            );
            if !l.data.is_empty() {
                let _ = write!(x, "<data {}/>", l.data);
            }
            if l.n_inputs > 0 {
                x.push_str("<input>");
                for i in 0..l.n_inputs {
                    let _ = write!(x, r#"<port id="{i}"/>"#);
                }
                x.push_str("</input>");
            }
            if !l.outputs.is_empty() {
                x.push_str("<output>");
                for (i, names) in l.outputs.iter().enumerate() {
                    let id = l.n_inputs + i;
                    let _ = write!(x, r#"<port id="{id}" precision="{}""#, l.output_precision);
                    if !names.is_empty() {
                        let _ = write!(x, r#" names="{names}""#);
                    }
                    x.push_str("/>");
                }
                x.push_str("</output>");
            }
            x.push_str("</layer>\n");
        }
        x.push_str("</layers>\n<edges>\n");
        for (from, to, to_port) in &self.edges {
            let _ = writeln!(
                x,
                r#"<edge from-layer="{}" from-port="{}" to-layer="{to}" to-port="{to_port}"/>"#,
                from.layer, from.port
            );
        }
        x.push_str("</edges>\n</net>\n");
        x
    }
}
