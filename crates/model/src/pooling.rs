//! Embeddings: one vector per text, pooled from the final-normed hidden states.
//!
//! A pass adds the hidden states of the rows a [`Pooling`] picks into a caller's sum
//! (see [`crate::Segment::pooled`]), one row after another, so a text prefilled in chunks
//! sums exactly what one pass would. [`Pooling::finish`] turns the sum into the
//! embedding: the mean for [`Pooling::Mean`], then L2-normalised, as sentence-transformers
//! and llama.cpp's embedding mode give it.

use std::ops::Range;

use crate::{ModelError, Result};

/// Which rows of a text make its embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// The mean of every token's hidden state: most embedding models.
    Mean,
    /// The first token's (BERT's `[CLS]`).
    Cls,
    /// The last token's: decoder embedding models (Qwen3-Embedding), whose last token
    /// is the only one that attended to the whole text.
    Last,
}

impl Pooling {
    pub const ALL: [Pooling; 3] = [Pooling::Mean, Pooling::Cls, Pooling::Last];

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// GGUF's `{arch}.pooling_type` (llama.cpp's `LLAMA_POOLING_TYPE_*`): `None` for 0
    /// (no pooling: a generative model); ranking heads are refused.
    pub fn from_gguf(value: u32) -> Result<Option<Self>> {
        match value {
            0 => Ok(None),
            1 => Ok(Some(Pooling::Mean)),
            2 => Ok(Some(Pooling::Cls)),
            3 => Ok(Some(Pooling::Last)),
            4 => Err(ModelError::BadConfig(
                "pooling_type 4 (rank: a reranker's classification head) is not implemented"
                    .to_string(),
            )),
            other => Err(ModelError::BadConfig(format!(
                "pooling_type {other} is not one of 0 (none), 1 (mean), 2 (cls), 3 (last)"
            ))),
        }
    }

    /// The rows of a chunk holding tokens `start..start + n` of a text of `len` tokens
    /// whose hidden states this pooling sums, relative to the chunk.
    pub fn rows(self, start: usize, n: usize, len: usize) -> Range<usize> {
        let end = start + n;
        match self {
            Pooling::Mean => 0..n,
            Pooling::Cls if start == 0 && n > 0 => 0..1,
            Pooling::Last if end == len && n > 0 => n - 1..n,
            Pooling::Cls | Pooling::Last => 0..0,
        }
    }

    /// The embedding of a text of `len` tokens from the sum of its pooled rows: divided
    /// by `len` for the mean, then scaled to unit length (a zero vector stays zero).
    pub fn finish(self, mut sum: Vec<f32>, len: usize) -> Vec<f32> {
        if self == Pooling::Mean && len > 0 {
            let inv = 1.0 / len as f32;
            sum.iter_mut().for_each(|x| *x *= inv);
        }
        let norm = sum
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt();
        if norm > 0.0 {
            let inv = (1.0 / norm) as f32;
            sum.iter_mut().for_each(|x| *x *= inv);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_of_a_text_pool_the_rows_one_pass_would() {
        // A text of 10 tokens in chunks of 4, 4, 2.
        let chunks = [(0, 4), (4, 4), (8, 2)];
        let picked = |p: Pooling| -> Vec<usize> {
            chunks
                .iter()
                .flat_map(|&(start, n)| p.rows(start, n, 10).map(move |r| start + r))
                .collect()
        };
        assert_eq!(picked(Pooling::Mean), (0..10).collect::<Vec<_>>());
        assert_eq!(picked(Pooling::Cls), [0]);
        assert_eq!(picked(Pooling::Last), [9]);
    }

    #[test]
    fn finishing_averages_and_normalises() {
        let e = Pooling::Mean.finish(vec![6.0, 8.0], 2);
        assert!((e[0] - 0.6).abs() < 1e-6 && (e[1] - 0.8).abs() < 1e-6);
        assert_eq!(Pooling::Last.finish(vec![0.0, 0.0], 1), [0.0, 0.0]);
        assert_eq!(Pooling::from_gguf(3).unwrap(), Some(Pooling::Last));
        assert_eq!(Pooling::from_gguf(0).unwrap(), None);
        assert!(Pooling::from_gguf(4).is_err());
    }
}
