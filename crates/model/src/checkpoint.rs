//! Where a model comes from: a GGUF file, or a Hugging Face directory (`config.json`,
//! `*.safetensors`). Both give a [`ModelConfig`] and tensors under GGUF's names in GGUF's
//! conventions, so the loader, calibration and every backend know one model format.

use std::path::Path;

use pyramid_gguf::{GgmlType, GgufFile};

use crate::hf::HfCheckpoint;
use crate::{ModelConfig, ModelError, Result};

/// Tensors by GGUF name (`blk.0.attn_q.weight`), as f32 in GGML element order.
pub trait TensorSource {
    /// The tensor's dims in GGML order, fastest-varying first: a `[n_out, n_in]` matrix
    /// is `[n_in, n_out]`.
    fn tensor_dims(&self, name: &str) -> Result<Vec<u64>>;
    fn has_tensor(&self, name: &str) -> bool;
    fn tensor_f32(&self, name: &str) -> Result<Vec<f32>>;
    /// How the tensor is stored: a GGUF's block type, or a float dtype under GGML's name.
    /// Stacked experts' names answer for their experts.
    fn tensor_type(&self, name: &str) -> Result<GgmlType>;
    /// The tensor's bytes as stored, for `--precision file` to repack a block type.
    fn tensor_bytes(&self, name: &str) -> Result<&[u8]>;
    /// Expert `expert`'s `[n_rows, n_cols]` matrix of the experts' tensor `name`
    /// (`shape` `[n_rows, n_cols, n_expert]`; GGML dims `[n_cols, n_rows, n_expert]`, as
    /// llama.cpp stacks them), as f32:
    /// one expert at a time, never the whole stack.
    fn expert_f32(&self, name: &str, expert: usize, shape: [usize; 3]) -> Result<Vec<f32>>;
    /// Gives back the memory that reading `name` mapped in: a loader converting tensor by
    /// tensor then never holds the whole file resident.
    fn release(&self, name: &str);
}

impl TensorSource for GgufFile {
    fn tensor_dims(&self, name: &str) -> Result<Vec<u64>> {
        Ok(self.tensor_info(name)?.dims.clone())
    }

    fn has_tensor(&self, name: &str) -> bool {
        GgufFile::has_tensor(self, name)
    }

    fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        Ok(GgufFile::tensor_f32(self, name)?)
    }

    fn tensor_type(&self, name: &str) -> Result<GgmlType> {
        Ok(self.tensor_info(name)?.ggml_type)
    }

    fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        // The reader maps each tensor from its own part of a split file.
        Ok(GgufFile::tensor_bytes(self, self.tensor_info(name)?))
    }

    fn expert_f32(
        &self,
        name: &str,
        expert: usize,
        [n_rows, n_cols, n_expert]: [usize; 3],
    ) -> Result<Vec<f32>> {
        let info = self.tensor_info(name)?;
        let expected = [n_cols as u64, n_rows as u64, n_expert as u64];
        if info.dims != expected {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: expected.to_vec(),
                found: info.dims.clone(),
            });
        }
        // Experts are consecutive whole rows, so each one's blocks are its own bytes.
        Ok(self.tensor_part_f32(name, expert, n_expert)?)
    }

    fn release(&self, name: &str) {
        GgufFile::release(self, name);
    }
}

/// An opened model: its configuration is read and checked, its tensors are mapped.
pub enum Checkpoint {
    Gguf { file: GgufFile, config: ModelConfig },
    HuggingFace(HfCheckpoint),
}

impl Checkpoint {
    /// A directory is a Hugging Face checkpoint; anything else is read as GGUF.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        if path.is_dir() {
            return Ok(Checkpoint::HuggingFace(HfCheckpoint::open(path)?));
        }
        Self::from_gguf(GgufFile::open(path)?)
    }

    /// A GGUF file already open (or built in memory).
    pub fn from_gguf(file: GgufFile) -> Result<Checkpoint> {
        let config = ModelConfig::from_gguf(&file)?;
        Ok(Checkpoint::Gguf { file, config })
    }

    pub fn config(&self) -> &ModelConfig {
        match self {
            Checkpoint::Gguf { config, .. } => config,
            Checkpoint::HuggingFace(hf) => hf.config(),
        }
    }

    pub fn tensors(&self) -> &dyn TensorSource {
        match self {
            Checkpoint::Gguf { file, .. } => file,
            Checkpoint::HuggingFace(hf) => hf,
        }
    }
}
