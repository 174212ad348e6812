//! Finding added tokens (`<|im_start|>` and the like) in text before BPE sees it.

use crate::vocab::{TokenType, Vocab};

/// A run of input text: plain text for BPE, or one added token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Segment<'t> {
    Text(&'t str),
    Added(u32),
}

/// Added tokens indexed by their first byte, longest first, so a scan finds the
/// leftmost-longest match as Hugging Face's added-vocabulary splitter does.
#[derive(Debug, Clone)]
pub(crate) struct AddedMatcher {
    by_first_byte: Vec<Vec<(String, u32, TokenType)>>,
}

impl AddedMatcher {
    pub fn new(vocab: &Vocab) -> AddedMatcher {
        let mut by_first_byte: Vec<Vec<(String, u32, TokenType)>> = vec![Vec::new(); 256];
        for ((piece, ty), id) in vocab.pieces.iter().zip(&vocab.types).zip(0u32..) {
            if let (true, Some(&first)) = (ty.is_added(), piece.as_bytes().first()) {
                by_first_byte[usize::from(first)].push((piece.clone(), id, *ty));
            }
        }
        for bucket in &mut by_first_byte {
            // Stable, so among equal texts the lowest id is tried first.
            bucket.sort_by_key(|(text, _, _)| std::cmp::Reverse(text.len()));
        }
        AddedMatcher { by_first_byte }
    }

    /// Splits `text` into plain runs and added tokens. Control tokens are matched only when
    /// `parse_special`; user-defined tokens always (as llama.cpp and Hugging Face do).
    pub fn split<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Segment<'t>> {
        let bytes = text.as_bytes();
        let mut segments = Vec::new();
        let mut plain_start = 0;
        let mut pos = 0;
        while pos < bytes.len() {
            // A token's first byte is never a UTF-8 continuation byte, so a match can only
            // start (and, being whole UTF-8, end) on a character boundary.
            let found = self.by_first_byte[usize::from(bytes[pos])]
                .iter()
                .filter(|(_, _, ty)| parse_special || *ty != TokenType::Control)
                .find(|(tok, _, _)| bytes[pos..].starts_with(tok.as_bytes()));
            match found {
                Some((tok, id, _)) => {
                    if plain_start < pos {
                        segments.push(Segment::Text(&text[plain_start..pos]));
                    }
                    segments.push(Segment::Added(*id));
                    pos += tok.len();
                    plain_start = pos;
                }
                None => pos += 1,
            }
        }
        if plain_start < bytes.len() {
            segments.push(Segment::Text(&text[plain_start..]));
        }
        segments
    }
}
