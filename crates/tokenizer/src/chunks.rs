//! Long texts cut into pieces that tokenise exactly as the whole would, so a prompt can be
//! checked against a token limit while it is tokenised instead of after.
//!
//! A cut goes just before a space that sits between two letters ("…word␣word…"). Every
//! pre-tokenizer this crate implements ends a word there and starts the next one with
//! that space (GPT-2's ` ?\p{L}+`, Qwen2's `[^\r\n\p{L}\p{N}]?\p{L}+`), and BPE merges
//! never cross a word, so the pieces' ids concatenate to the whole text's ids.

/// Bytes of text tokenised at a time: large enough that cutting costs nothing, small
/// enough that a prompt far over the limit stops early.
pub(crate) const CHUNK_BYTES: usize = 64 << 10;

/// `text` as consecutive pieces of at least `min_bytes` (the last may be shorter), each
/// ending before a letter–space–letter boundary; text without such a boundary stays whole.
pub(crate) fn pieces(text: &str, min_bytes: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let cut = next_cut(rest, min_bytes.max(1)).unwrap_or(rest.len());
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

/// The first byte offset at or after `from` where a space lies between two letters.
fn next_cut(text: &str, from: usize) -> Option<usize> {
    if from >= text.len() {
        return None;
    }
    let mut start = from;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let mut prev = text[..start].chars().next_back();
    let mut chars = text[start..].char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next = chars.peek().map(|&(_, n)| n);
        if c == ' '
            && prev.is_some_and(char::is_alphabetic)
            && next.is_some_and(char::is_alphabetic)
        {
            return Some(start + i);
        }
        prev = Some(c);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_text_and_cut_only_between_words() {
        let text = "alpha beta  gamma\n delta 12 epsilon ζήτα ηta";
        for min in [1, 3, 8, 100] {
            let parts: Vec<&str> = pieces(text, min).collect();
            assert_eq!(parts.concat(), text, "min {min}");
            for part in &parts[1..] {
                assert!(part.starts_with(' '), "{part:?}");
            }
        }
        assert_eq!(pieces("nospaceshere", 2).count(), 1);
        assert_eq!(pieces("", 2).count(), 0);
    }
}
