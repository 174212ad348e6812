//! Bounded GGUF reader over a memory map.
//!
//! Every length read from the file is checked against the bytes that remain before
//! anything is allocated, so a corrupt or hostile file costs at most its own size.
//! A model split by llama.cpp (`name-00001-of-00003.gguf`, ...) opens as one file from
//! its first part: see [`crate::split`].

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::metadata::{Metadata, Value};
use crate::{quants, GgmlType, GgufError, Result};

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// GGML tensors have at most four dimensions.
pub const MAX_DIMS: u32 = 4;
/// Elements reserved up front for an array or the tensor directory: a count read from the
/// file is checked against the bytes left, but an in-memory `Value` is larger than its
/// encoding, so larger collections grow as they are actually read.
const MAX_PREALLOC: usize = 4096;
/// Arrays of arrays deeper than this are rejected rather than recursed into.
const MAX_ARRAY_DEPTH: u32 = 4;

/// Where a tensor lives and how it is laid out. `dims[0]` is the innermost (contiguous)
/// dimension, as in GGML: a `[n_out, n_in]` matrix has `dims = [n_in, n_out]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset from the start of the data section of its part.
    pub offset: u64,
    pub n_bytes: u64,
    /// Which part of a split model holds the data (0 for a file that is not split).
    pub split_idx: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

enum Storage {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// One file's bytes and where its tensor data starts.
pub(crate) struct Part {
    storage: Storage,
    data_offset: u64,
}

/// What one file's header says.
pub(crate) struct Header {
    pub(crate) version: u32,
    pub(crate) metadata: Metadata,
    pub(crate) tensors: Vec<TensorInfo>,
}

/// One file as parsed, before the parts of a split model are joined.
pub(crate) struct Parsed {
    pub(crate) part: Part,
    pub(crate) header: Header,
}

/// An opened GGUF file: parsed header, metadata and tensor directory; tensor data stays
/// in the mapping until asked for. A split model is one `GgufFile` whose tensors live in
/// several mappings; the metadata is its first part's.
pub struct GgufFile {
    parts: Vec<Part>,
    /// The files of a split model, first part first; empty when not split.
    split_paths: Vec<PathBuf>,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("n_split", &self.parts.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens a GGUF file; the first part of a split model brings in the others from
    /// beside it, and a missing part is an error naming it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let first = Parsed::map(path)?;
        match crate::split::n_split(&first.header.metadata)? {
            Some(n_split) if n_split > 1 => crate::split::open_rest(path, first, n_split),
            _ => Self::join(vec![first.part], Vec::new(), first.header),
        }
    }

    /// Parses a file held in memory (tests, and files produced by [`crate::GgufWriter`]).
    /// One part of a split model is refused: its other parts could not be found.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        let parsed = Parsed::parse(Storage::Owned(bytes))?;
        if let Some(n_split) = crate::split::n_split(&parsed.header.metadata)?.filter(|&n| n > 1) {
            return Err(GgufError::Invalid(format!(
                "this is one part of a model split in {n_split}: open its first part by path"
            )));
        }
        Self::join(vec![parsed.part], Vec::new(), parsed.header)
    }

    /// The file (or first part) whose header gave the metadata, with the tensors of every
    /// part (each `split_idx` naming its part in `parts`), indexed by name.
    pub(crate) fn join(parts: Vec<Part>, split_paths: Vec<PathBuf>, first: Header) -> Result<Self> {
        let mut by_name = HashMap::with_capacity(first.tensors.len());
        for (i, t) in first.tensors.iter().enumerate() {
            if by_name.insert(t.name.clone(), i).is_some() {
                return Err(GgufError::Corrupt(format!(
                    "tensor '{}' appears twice",
                    t.name
                )));
            }
        }
        Ok(Self {
            parts,
            split_paths,
            version: first.version,
            metadata: first.metadata,
            tensors: first.tensors,
            by_name,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// The files of a split model, first part first; empty for a model in one file.
    pub fn split_paths(&self) -> &[PathBuf] {
        &self.split_paths
    }
}

impl Parsed {
    /// Maps and parses one file.
    pub(crate) fn map(path: &Path) -> Result<Self> {
        let open_err = |source| GgufError::Open {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(open_err)?;
        // SAFETY: the mapping is read-only and private to this process; model files are
        // not expected to be modified while loaded (as in every mmap-based engine).
        let mmap = unsafe { Mmap::map(&file) }.map_err(open_err)?;
        Self::parse(Storage::Mapped(mmap))
    }

    fn parse(storage: Storage) -> Result<Self> {
        let bytes = storage.bytes();
        let mut cur = Cursor { bytes, pos: 0 };
        let magic: [u8; 4] = cur.take(4, "magic")?.try_into().expect("took 4 bytes");
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = cur.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = cur.u64("tensor count")?;
        let n_kv = cur.u64("metadata count")?;
        // Each kv needs at least 8 (key len) + 4 (type) + 1 bytes; each tensor info at least 8 + 4 + 4 + 8.
        cur.check_count(n_kv, 13, "metadata count")?;
        cur.check_count(n_tensors, 24, "tensor count")?;

        let mut metadata = Metadata::new();
        for _ in 0..n_kv {
            let key = cur.string("metadata key")?;
            let type_id = cur.u32("metadata value type")?;
            let value = cur.value(type_id, 0, &key)?;
            // Keys must be unique; silently keeping one of two values would hide corruption.
            if metadata.get(&key).is_some() {
                return Err(GgufError::Corrupt(format!(
                    "metadata key '{key}' appears twice"
                )));
            }
            metadata.insert(key, value);
        }

        let mut tensors = Vec::with_capacity((n_tensors as usize).min(MAX_PREALLOC));
        let mut by_name = HashMap::with_capacity((n_tensors as usize).min(MAX_PREALLOC));
        for _ in 0..n_tensors {
            let name = cur.string("tensor name")?;
            let n_dims = cur.u32("tensor dimension count")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::Corrupt(format!(
                    "tensor '{name}' has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(cur.u64("tensor dimension")?);
            }
            let type_id = cur.u32("tensor type")?;
            let ggml_type =
                GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
                    tensor: name.clone(),
                    id: type_id,
                })?;
            let offset = cur.u64("tensor offset")?;
            // Rows (runs along dims[0]) must be whole blocks, or no row could be decoded alone.
            if dims[0] % ggml_type.block_len() as u64 != 0 {
                return Err(GgufError::Corrupt(format!(
                    "tensor '{name}' rows of {} elements are not whole {ggml_type} blocks of {}",
                    dims[0],
                    ggml_type.block_len()
                )));
            }
            let n_elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| {
                    GgufError::Corrupt(format!("tensor '{name}' dimensions {dims:?} overflow"))
                })?;
            let n_bytes = ggml_type.bytes_for(n_elements).ok_or_else(|| {
                GgufError::Corrupt(format!(
                    "tensor '{name}' has {n_elements} elements, not a whole number of {ggml_type} blocks of {}",
                    ggml_type.block_len()
                ))
            })?;
            if by_name.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::Corrupt(format!("tensor '{name}' appears twice")));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                n_bytes,
                split_idx: 0,
            });
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_integer() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() && a <= 1 << 20 => a as u64,
                _ => {
                    return Err(GgufError::Corrupt(format!(
                        "general.alignment = {v:?} is not a power of two"
                    )))
                }
            },
        };
        let data_offset = (cur.pos as u64).div_ceil(alignment) * alignment;
        let len = bytes.len() as u64;
        for t in &tensors {
            if t.offset % alignment != 0 {
                return Err(GgufError::Corrupt(format!(
                    "tensor '{}' offset {} is not aligned to {alignment}",
                    t.name, t.offset
                )));
            }
            let end = data_offset
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(t.n_bytes));
            match end {
                Some(end) if end <= len => {}
                _ => {
                    return Err(GgufError::Truncated {
                        what: "tensor data",
                        offset: data_offset.saturating_add(t.offset),
                        needed: t.n_bytes,
                        len,
                    })
                }
            }
        }

        Ok(Self {
            part: Part {
                storage,
                data_offset,
            },
            header: Header {
                version,
                metadata,
                tensors,
            },
        })
    }
}

impl GgufFile {
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.by_name
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The raw (possibly quantised) bytes of a tensor; bounds were checked at open.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let part = &self.parts[info.split_idx];
        let start = (part.data_offset + info.offset) as usize;
        &part.storage.bytes()[start..start + info.n_bytes as usize]
    }

    /// Gives back the mapped pages of a tensor already read: a loader converting tensor
    /// by tensor then never holds the whole file resident. A later read maps them in again.
    pub fn release(&self, name: &str) {
        let Some(info) = self.by_name.get(name).map(|&i| &self.tensors[i]) else {
            return;
        };
        let part = &self.parts[info.split_idx];
        let Storage::Mapped(mmap) = &part.storage else {
            return;
        };
        let start = (part.data_offset + info.offset) as usize;
        // SAFETY: the mapping is a read-only shared file mapping; dropping its pages loses
        // nothing, the kernel reads them from the file again if touched. Failure only means
        // the pages stay resident.
        let _ = unsafe {
            mmap.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                start,
                info.n_bytes as usize,
            )
        };
    }

    /// A tensor dequantised to f32, in GGML element order.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        self.tensor_part_f32(name, 0, 1)
    }

    /// Part `part` of a tensor cut into `n_parts` equal consecutive parts, dequantised
    /// alone: one expert of llama.cpp's stacked expert tensors, without the rest.
    pub fn tensor_part_f32(&self, name: &str, part: usize, n_parts: usize) -> Result<Vec<f32>> {
        let info = self.tensor_info(name)?;
        let bytes = self.tensor_bytes(info);
        let n_elements = info.n_elements() as usize;
        if part >= n_parts
            || !bytes.len().is_multiple_of(n_parts)
            || !n_elements.is_multiple_of(n_parts)
        {
            return Err(GgufError::Invalid(format!(
                "tensor '{name}' ({n_elements} values in {} bytes) has no part {part} of {n_parts}",
                bytes.len()
            )));
        }
        let per_part = bytes.len() / n_parts;
        let mut out = vec![0f32; n_elements / n_parts];
        let bytes = &bytes[part * per_part..(part + 1) * per_part];
        quants::dequantize(info.ggml_type, bytes, &mut out).map_err(|err| match err {
            GgufError::UnsupportedTensorType(ty) => GgufError::UnsupportedTensor {
                tensor: name.to_string(),
                ty,
            },
            other => other,
        })?;
        Ok(out)
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what,
                offset: self.pos as u64,
                needed: n,
                len: self.bytes.len() as u64,
            });
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    /// Rejects a count whose minimal encoding could not fit in the rest of the file.
    fn check_count(&self, count: u64, min_bytes_each: u64, what: &'static str) -> Result<()> {
        if count.saturating_mul(min_bytes_each) > self.remaining() {
            return Err(GgufError::Truncated {
                what,
                offset: self.pos as u64,
                needed: count.saturating_mul(min_bytes_each),
                len: self.bytes.len() as u64,
            });
        }
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("took N bytes"))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &'static str) -> Result<String> {
        let len = self.u64(what)?;
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| {
            GgufError::Corrupt(format!(
                "{what} at offset {} is not UTF-8",
                self.pos as u64 - len
            ))
        })
    }

    fn value(&mut self, type_id: u32, depth: u32, key: &str) -> Result<Value> {
        const W: &str = "metadata value";
        Ok(match type_id {
            0 => Value::U8(self.array::<1>(W)?[0]),
            1 => Value::I8(self.array::<1>(W)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(W)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(W)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(W)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(W)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(W)?)),
            7 => match self.array::<1>(W)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(GgufError::Corrupt(format!(
                        "metadata '{key}': bool byte {b}"
                    )))
                }
            },
            8 => Value::String(self.string(W)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::Corrupt(format!(
                        "metadata '{key}': arrays nested too deep"
                    )));
                }
                let elem_type = self.u32("array element type")?;
                let count = self.u64("array length")?;
                let min_size = match elem_type {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10 | 11 | 12 => 8,
                    9 => 12,
                    t => {
                        return Err(GgufError::Corrupt(format!(
                            "metadata '{key}': unknown array element type {t}"
                        )))
                    }
                };
                self.check_count(count, min_size, "array")?;
                let mut items = Vec::with_capacity((count as usize).min(MAX_PREALLOC));
                for _ in 0..count {
                    items.push(self.value(elem_type, depth + 1, key)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(W)?)),
            11 => Value::I64(i64::from_le_bytes(self.array(W)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(W)?)),
            t => {
                return Err(GgufError::Corrupt(format!(
                    "metadata '{key}': unknown value type {t}"
                )))
            }
        })
    }
}
