//! GGUF v3 writer, mainly for tests that need small models with known weights.

use std::io::Write;
use std::path::Path;

use crate::metadata::Value;
use crate::reader::MAX_DIMS;
use crate::{quants, split, GgmlType, GgufError, GgufFile, Result, DEFAULT_ALIGNMENT, GGUF_MAGIC};

const VERSION: u32 = 3;
/// Array nesting the reader accepts (an array value at depth 4 is rejected).
const MAX_ARRAY_NESTING: u32 = 4;
const ALIGNMENT_KEY: &str = "general.alignment";

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    bytes: Vec<u8>,
}

/// Builds a GGUF v3 file in memory: metadata in insertion order, then tensor infos, then
/// tensor data, each tensor starting on a multiple of `general.alignment` (default 32).
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl std::fmt::Debug for GgufWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter")
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of an opened file's metadata and tensors, to write again (split, for
    /// instance); a split file's `split.*` keys are left out.
    pub fn from_file(file: &GgufFile) -> Result<Self> {
        let mut writer = Self::new();
        for (key, value) in file.metadata().iter() {
            if !key.starts_with("split.") {
                writer.add_metadata(key, value.clone())?;
            }
        }
        for info in file.tensors() {
            let bytes = file.tensor_bytes(info).to_vec();
            writer.add_tensor(&info.name, &info.dims, info.ggml_type, bytes)?;
        }
        Ok(writer)
    }

    /// Adds (or replaces) a metadata entry. Fails for values GGUF cannot encode or this
    /// crate's reader would reject: arrays mixing element types, arrays nested more than
    /// four deep, and a `general.alignment` that is not a power-of-two integer up to 2^20.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> Result<&mut Self> {
        let key = key.into();
        check_value(&key, &value, 0)?;
        if key == ALIGNMENT_KEY {
            alignment_of(&value).ok_or_else(|| {
                GgufError::Invalid(format!(
                    "{ALIGNMENT_KEY} = {value:?} is not a power of two up to 2^20"
                ))
            })?;
        }
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((key, value)),
        }
        Ok(self)
    }

    /// Adds a tensor from raw bytes already in `ty`'s layout. `dims[0]` is the innermost
    /// dimension and must hold whole blocks, so every row can be dequantised alone.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        bytes: Vec<u8>,
    ) -> Result<()> {
        let name = name.into();
        let n_elements = check_dims(&name, dims, ty)?;
        let expected = ty.bytes_for(n_elements).ok_or_else(|| {
            GgufError::Invalid(format!(
                "tensor '{name}': {n_elements} elements of {ty} overflow"
            ))
        })?;
        if expected != bytes.len() as u64 {
            return Err(GgufError::Invalid(format!(
                "tensor '{name}': {n_elements} elements of {ty} need {expected} bytes, got {}",
                bytes.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::Invalid(format!(
                "tensor '{name}' was already added"
            )));
        }
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty,
            bytes,
        });
        Ok(())
    }

    /// Adds a tensor from f32 values (GGML order), quantised to `ty` with [`quants::quantize`].
    pub fn add_tensor_f32(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        values: &[f32],
    ) -> Result<()> {
        let name = name.into();
        let n_elements = check_dims(&name, dims, ty)?;
        if n_elements != values.len() as u64 {
            return Err(GgufError::Invalid(format!(
                "tensor '{name}': dims {dims:?} hold {n_elements} elements, got {} values",
                values.len()
            )));
        }
        let bytes = quants::quantize(ty, values)?;
        self.add_tensor(name, dims, ty, bytes)
    }

    /// The complete file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_into(&mut out)
            .expect("writing into a Vec<u8> cannot fail");
        out
    }

    /// Writes the file to `path` through a temporary file in the same directory that is
    /// renamed into place, so a failed write never leaves a partial file at `path`.
    pub fn write_to_path(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let file_name = path.file_name().ok_or_else(|| {
            GgufError::Invalid(format!(
                "cannot write GGUF to {}: not a file path",
                path.display()
            ))
        })?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(file_name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let result = (|| -> std::io::Result<()> {
            let file = std::fs::File::create(&tmp)?;
            let mut w = std::io::BufWriter::new(file);
            self.write_into(&mut w)?;
            let file = w.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = result {
            // Best effort: the original error is the one worth reporting.
            let _ = std::fs::remove_file(&tmp);
            return Err(GgufError::Write(e));
        }
        Ok(())
    }

    /// The model split in `n_split` files as llama.cpp's `gguf-split` writes them: the
    /// tensors in order, as evenly as whole tensors allow; the first part carries all the
    /// metadata, every part `split.no`, `split.count` and `split.tensors.count` (see
    /// [`crate::split`]). Name the parts with [`crate::split::split_file_name`].
    pub fn to_split_bytes(&self, n_split: usize) -> Result<Vec<Vec<u8>>> {
        if n_split < 2 || n_split > self.tensors.len() || n_split > usize::from(u16::MAX) {
            return Err(GgufError::Invalid(format!(
                "cannot split {} tensors in {n_split} parts (2 to one per tensor)",
                self.tensors.len()
            )));
        }
        let n_tensors = i32::try_from(self.tensors.len()).map_err(|_| {
            GgufError::Invalid(format!("{} tensors are too many", self.tensors.len()))
        })?;
        let mut parts = Vec::with_capacity(n_split);
        let mut first_tensor = 0;
        for split_idx in 0..n_split {
            let end = (split_idx + 1) * self.tensors.len() / n_split;
            let mut metadata = if split_idx == 0 {
                self.metadata.clone()
            } else {
                Vec::new()
            };
            metadata.extend([
                (
                    split::KEY_SPLIT_NO.to_string(),
                    Value::U16(split_idx as u16),
                ),
                (
                    split::KEY_SPLIT_COUNT.to_string(),
                    Value::U16(n_split as u16),
                ),
                (
                    split::KEY_SPLIT_TENSORS_COUNT.to_string(),
                    Value::I32(n_tensors),
                ),
            ]);
            let mut out = Vec::new();
            write_file(&mut out, &metadata, &self.tensors[first_tensor..end])?;
            parts.push(out);
            first_tensor = end;
        }
        Ok(parts)
    }

    fn write_into(&self, w: &mut impl Write) -> std::io::Result<()> {
        write_file(w, &self.metadata, &self.tensors)
    }
}

/// One GGUF file of `metadata` and `tensors`, aligned as its metadata says.
fn write_file(
    w: &mut impl Write,
    metadata: &[(String, Value)],
    tensors: &[PendingTensor],
) -> std::io::Result<()> {
    let alignment = metadata
        .iter()
        .find(|(k, _)| k == ALIGNMENT_KEY)
        .and_then(|(_, v)| alignment_of(v))
        .unwrap_or(DEFAULT_ALIGNMENT);
    let mut header = Vec::new();
    header.extend_from_slice(&GGUF_MAGIC);
    header.extend_from_slice(&VERSION.to_le_bytes());
    header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    header.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_string(&mut header, key);
        header.extend_from_slice(&type_id(value).to_le_bytes());
        put_value(&mut header, value);
    }
    let mut offset = 0u64;
    for t in tensors {
        put_string(&mut header, &t.name);
        header.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            header.extend_from_slice(&d.to_le_bytes());
        }
        header.extend_from_slice(&t.ty.id().to_le_bytes());
        header.extend_from_slice(&offset.to_le_bytes());
        offset += padded(t.bytes.len() as u64, alignment);
    }
    let zeros = vec![0u8; alignment as usize];
    let padding = |len: usize| &zeros[..(padded(len as u64, alignment) - len as u64) as usize];
    w.write_all(&header)?;
    w.write_all(padding(header.len()))?;
    for t in tensors {
        w.write_all(&t.bytes)?;
        w.write_all(padding(t.bytes.len()))?;
    }
    Ok(())
}

fn padded(n: u64, alignment: u64) -> u64 {
    n.div_ceil(alignment) * alignment
}

fn alignment_of(v: &Value) -> Option<u64> {
    match v.as_integer() {
        Some(a) if a > 0 && a <= 1 << 20 && (a as u64).is_power_of_two() => Some(a as u64),
        _ => None,
    }
}

/// Checks the dimension count and row blocking, and returns the element count.
fn check_dims(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64> {
    if dims.is_empty() || dims.len() > MAX_DIMS as usize {
        return Err(GgufError::Invalid(format!(
            "tensor '{name}' has {} dimensions (1 to {MAX_DIMS} allowed)",
            dims.len()
        )));
    }
    if !dims[0].is_multiple_of(ty.block_len() as u64) {
        return Err(GgufError::Invalid(format!(
            "tensor '{name}': rows of {} elements are not whole {ty} blocks of {}",
            dims[0],
            ty.block_len()
        )));
    }
    dims.iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| GgufError::Invalid(format!("tensor '{name}': dimensions {dims:?} overflow")))
}

/// GGUF's value type ids.
fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

/// GGUF arrays carry one element type, so every element must be the same variant.
fn check_value(key: &str, v: &Value, depth: u32) -> Result<()> {
    let Value::Array(items) = v else {
        return Ok(());
    };
    if depth >= MAX_ARRAY_NESTING {
        return Err(GgufError::Invalid(format!(
            "metadata '{key}': arrays nested more than {MAX_ARRAY_NESTING} deep"
        )));
    }
    if let Some(first) = items.first() {
        let ty = type_id(first);
        if let Some(other) = items.iter().find(|i| type_id(i) != ty) {
            return Err(GgufError::Invalid(format!(
                "metadata '{key}': array mixes {} and {}",
                first.type_name(),
                other.type_name()
            )));
        }
    }
    items
        .iter()
        .try_for_each(|i| check_value(key, i, depth + 1))
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::Array(items) => {
            // An empty array's element type is not recoverable; u8 is as good as any.
            let elem = items.first().map_or(0, type_id);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            // Nested arrays carry their own element type and count.
            for item in items {
                put_value(out, item);
            }
        }
    }
}
