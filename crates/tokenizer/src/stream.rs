//! Incremental detokenization: text out as soon as it is complete UTF-8.

use crate::{Result, Tokenizer};

/// Turns a stream of token ids into text chunks that are always whole UTF-8.
///
/// A byte-level token can end in the middle of a multi-byte character (an emoji is often
/// split over two or three tokens), so bytes of an unfinished character are held back until
/// the rest arrives. Bytes that can never become valid UTF-8 are emitted as U+FFFD at once,
/// so the concatenated chunks equal [`Tokenizer::decode`] of all ids.
///
/// The decoder holds no reference to the tokenizer, so it can live in per-request state
/// while the tokenizer sits behind an `Arc`.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    /// Bytes received but not yet emitted: at most an unfinished character's first 3 bytes.
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        let bytes = tokenizer.token_bytes_checked(id)?;
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(text) => {
                    out.push_str(text);
                    self.pending.clear();
                    break;
                }
                Err(err) => {
                    let valid = err.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match err.error_len() {
                        // The tail is a character still missing bytes: wait for them.
                        None => {
                            self.pending.drain(..valid);
                            break;
                        }
                        // Bytes that no continuation can fix: replace them as decode() would.
                        Some(n_bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + n_bad);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether bytes of an unfinished character are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the stream: a held-back partial character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let tail = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        tail
    }
}
