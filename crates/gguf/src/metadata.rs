//! Typed access to GGUF key/value metadata.

use std::collections::BTreeMap;

use crate::{GgufError, Result};

/// One metadata value. Arrays hold values of a single element type.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// Any integer value widened to i128, so callers need not care which width a writer chose.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_integer().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

/// The key/value section of a GGUF file, keyed by dotted names such as `llama.block_count`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: BTreeMap<String, Value>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, key: impl Into<String>, value: Value) {
        self.entries.insert(key.into(), value);
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.get(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong(key: &str, expected: &'static str, found: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: found.type_name(),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong(key, "string", v))
    }

    /// An integer of any width that fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_integer()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| Self::wrong(key, "unsigned integer", v))
    }

    /// An integer of any width that fits in `usize`.
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        let n = self.get_u64(key)?;
        usize::try_from(n)
            .map_err(|_| GgufError::Invalid(format!("metadata '{key}' = {n} is too large")))
    }

    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|f| f as f32)
            .ok_or_else(|| Self::wrong(key, "number", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(Self::wrong(key, "bool", v)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        match self.require(key)? {
            Value::Array(items) => Ok(items),
            v => Err(Self::wrong(key, "array", v)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| Self::wrong(key, "array of string", v))
            })
            .collect()
    }

    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| Self::wrong(key, "array of number", v))
            })
            .collect()
    }

    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.as_integer()
                    .and_then(|i| i64::try_from(i).ok())
                    .ok_or_else(|| Self::wrong(key, "array of integer", v))
            })
            .collect()
    }

    /// `Ok(None)` when absent, an error when present with the wrong type.
    pub fn opt<T>(&self, key: &str, get: impl Fn(&Self, &str) -> Result<T>) -> Result<Option<T>> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        get(self, key).map(Some)
    }
}
