//! The GGUF model file format, and nothing else.
//!
//! - [`GgufFile`]: a memory-mapped, bounds-checked reader. Every length read from a file
//!   is checked against what remains of it, so corrupt input is an error, never a panic
//!   or an unbounded allocation.
//! - [`Metadata`] / [`Value`]: typed access to the key/value section.
//! - [`GgmlType`] and [`quants`]: block layouts and dequantisation to f32.
//! - [`GgufWriter`]: writes GGUF v3, used by tests to build tiny random-weight models,
//!   whole or split.
//! - [`split`]: models split over several files (`-00001-of-00003.gguf`), which
//!   [`GgufFile::open`] joins into one.

mod error;
mod metadata;
pub mod quants;
mod reader;
pub mod split;
mod types;
mod writer;

pub use error::{GgufError, Result};
pub use metadata::{Metadata, Value};
pub use reader::{GgufFile, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC};
pub use types::{GgmlType, QK_K};
pub use writer::GgufWriter;
