//! SentencePiece vocabularies (`tokenizer.ggml.model = llama`: Gemma, Llama 2, Mistral),
//! tokenized as llama.cpp and SentencePiece's BPE mode do.
//!
//! Spaces become `▁` (U+2581), the text is cut into characters, and adjacent symbols are
//! merged, best-scoring result first (ties to the leftmost pair), for as long as the merged
//! text is a piece of the vocabulary. A character no piece covers becomes its UTF-8 bytes'
//! `<0xXX>` tokens (byte fallback), or the unknown token in a vocabulary without them.
//!
//! Written here rather than on the `tokenizers` crate: GGUF stores pieces and scores, not
//! the merge list a `tokenizers` BPE model needs, and the score-driven merge is short.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::vocab::{TokenType, Vocab};

/// SentencePiece's whitespace marker.
pub(crate) const SPACE_MARK: char = '\u{2581}';

/// A SentencePiece model for text that holds no added tokens (split off beforehand).
#[derive(Debug, Clone)]
pub(crate) struct SentencePiece {
    /// Pieces that merges may produce, by text.
    ids: HashMap<String, u32>,
    /// `tokenizer.ggml.scores`: higher merges first.
    scores: Vec<f32>,
    /// `<0xXX>` tokens, by byte.
    byte_ids: [Option<u32>; 256],
    unk_id: Option<u32>,
}

/// A run of the text being merged: its byte span and its neighbours in the chain.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Two adjacent symbols whose concatenation is a piece.
#[derive(Debug, Clone, Copy)]
struct Pair {
    left: usize,
    right: usize,
    score: f32,
    /// Bytes of the merged text: a pair whose symbols changed since is stale.
    len: usize,
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pair {
    /// The best pair is the greatest: highest score, then leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl SentencePiece {
    pub fn new(vocab: &Vocab, scores: Vec<f32>, unk_id: Option<u32>) -> SentencePiece {
        let mut ids = HashMap::with_capacity(vocab.n_vocab());
        let mut byte_ids = [None; 256];
        for ((piece, ty), id) in vocab.pieces.iter().zip(&vocab.types).zip(0u32..) {
            match ty {
                TokenType::Byte => {
                    if let Some(byte) = parse_byte_piece(piece) {
                        byte_ids[usize::from(byte)].get_or_insert(id);
                    }
                }
                TokenType::Normal | TokenType::Undefined => {
                    // The first of duplicate pieces wins, as in SentencePiece.
                    ids.entry(piece.clone()).or_insert(id);
                }
                _ => {}
            }
        }
        SentencePiece {
            ids,
            scores,
            byte_ids,
            unk_id,
        }
    }

    /// Appends the ids of `text` (which must hold no added tokens) to `out`; with
    /// `space_prefix`, as if the text began with a space.
    pub fn encode_into(&self, text: &str, space_prefix: bool, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut escaped = String::with_capacity(text.len() + 3);
        if space_prefix {
            escaped.push(SPACE_MARK);
        }
        escaped.extend(text.chars().map(|c| if c == ' ' { SPACE_MARK } else { c }));
        let text = escaped.as_str();

        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .enumerate()
            .map(|(i, (start, c))| Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: Some(i + 1),
            })
            .collect();
        if let Some(last) = symbols.last_mut() {
            last.next = None;
        }
        let mut queue = BinaryHeap::new();
        for left in 1..symbols.len() {
            self.push_pair(text, &symbols, left - 1, left, &mut queue);
        }
        while let Some(pair) = queue.pop() {
            let (l, r) = (symbols[pair.left], symbols[pair.right]);
            // Either side merged into something else since this pair was queued.
            if l.len == 0 || r.len == 0 || l.len + r.len != pair.len || l.next != Some(pair.right) {
                continue;
            }
            symbols[pair.left].len += r.len;
            symbols[pair.left].next = r.next;
            symbols[pair.right].len = 0;
            if let Some(next) = r.next {
                symbols[next].prev = Some(pair.left);
            }
            if let Some(prev) = l.prev {
                self.push_pair(text, &symbols, prev, pair.left, &mut queue);
            }
            if let Some(next) = r.next {
                self.push_pair(text, &symbols, pair.left, next, &mut queue);
            }
        }
        let mut at = (!symbols.is_empty()).then_some(0);
        while let Some(i) = at {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => self.fall_back(piece, out),
            }
            at = s.next;
        }
    }

    fn push_pair(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Pair>,
    ) {
        let (l, r) = (symbols[left], symbols[right]);
        let merged = &text[l.start..r.start + r.len];
        if let Some(&id) = self.ids.get(merged) {
            queue.push(Pair {
                left,
                right,
                score: self.scores.get(id as usize).copied().unwrap_or(f32::MIN),
                len: merged.len(),
            });
        }
    }

    /// A character no piece covers: its bytes' tokens, else one unknown token.
    fn fall_back(&self, piece: &str, out: &mut Vec<u32>) {
        let bytes: Option<Vec<u32>> = piece
            .bytes()
            .map(|b| self.byte_ids[usize::from(b)])
            .collect();
        match bytes {
            Some(ids) => out.extend(ids),
            None => out.extend(self.unk_id),
        }
    }
}

/// The byte a `<0xXX>` piece stands for.
pub(crate) fn parse_byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces with scores; every piece is Normal.
    fn model(pieces: &[(&str, f32)]) -> (Vec<String>, SentencePiece) {
        let mut all: Vec<(String, f32, TokenType)> = (0..=255u8)
            .map(|b| (format!("<0x{b:02X}>"), 0.0, TokenType::Byte))
            .collect();
        all.extend(
            pieces
                .iter()
                .map(|(p, s)| (p.to_string(), *s, TokenType::Normal)),
        );
        let vocab = Vocab::from_parts(
            all.iter().map(|(p, _, _)| p.clone()).collect(),
            all.iter().map(|(_, _, t)| *t).collect(),
            crate::vocab::PieceBytes::SentencePiece,
        )
        .expect("vocab");
        let scores = all.iter().map(|(_, s, _)| *s).collect();
        let names = vocab.pieces.clone();
        (names, SentencePiece::new(&vocab, scores, None))
    }

    fn pieces_of(names: &[String], spm: &SentencePiece, text: &str, prefix: bool) -> Vec<String> {
        let mut ids = Vec::new();
        spm.encode_into(text, prefix, &mut ids);
        ids.iter().map(|&i| names[i as usize].clone()).collect()
    }

    #[test]
    fn merges_take_the_best_score_first_and_ties_leftmost() {
        let (names, spm) = model(&[
            ("a", -1.0),
            ("b", -1.0),
            ("ab", -5.0),
            ("bb", -2.0),
            ("▁", -1.0),
            ("▁a", -3.0),
        ]);
        // "bb" outscores "ab", so "abb" is a + bb.
        assert_eq!(pieces_of(&names, &spm, "abb", false), ["a", "bb"]);
        // Equal scores: the leftmost pair merges first ("bb" "b").
        assert_eq!(pieces_of(&names, &spm, "bbb", false), ["bb", "b"]);
        assert_eq!(pieces_of(&names, &spm, "a a", false), ["a", "▁a"]);
        assert_eq!(pieces_of(&names, &spm, "a", true), ["▁a"]);
    }

    #[test]
    fn characters_without_a_piece_fall_back_to_bytes() {
        let (names, spm) = model(&[("a", -1.0)]);
        assert_eq!(
            pieces_of(&names, &spm, "aé", false),
            ["a", "<0xC3>", "<0xA9>"]
        );
    }

    #[test]
    fn byte_pieces_parse_only_their_own_form() {
        assert_eq!(parse_byte_piece("<0x0A>"), Some(b'\n'));
        assert_eq!(parse_byte_piece("<0xff>"), Some(0xff));
        assert_eq!(parse_byte_piece("<0x1>"), None);
        assert_eq!(parse_byte_piece("0x0A"), None);
    }
}
