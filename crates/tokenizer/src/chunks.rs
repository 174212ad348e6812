//! Long texts cut into pieces that tokenise exactly as the whole would, so a prompt can be
//! checked against a token limit while it is tokenised instead of after.
//!
//! A cut goes just before a space that sits between a letter or a digit and a letter
//! ("…word␣word…", "…w123␣w124…"). Every pre-tokenizer this crate implements ends a word
//! or a number there and starts the next word with that space (GPT-2's ` ?\p{L}+` after
//! ` ?\p{N}+`, Qwen2's `[^\r\n\p{L}\p{N}]?\p{L}+` after `\p{N}`, Llama 3's after
//! `\p{N}{1,3}`), and BPE merges never cross a word, so the pieces' ids concatenate to the
//! whole text's ids. Without the digit case, a 14.5 MB prompt of `w123456 ` repeated had
//! no cut at all and was tokenised whole (25 s and 4.7 GB on Qwen) before its length was
//! refused.

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

/// The first byte offset at or after `from` where a space lies between a letter or a
/// digit and a letter.
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
            && prev.is_some_and(char::is_alphanumeric)
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
        // A number before a word ends where the word's space starts.
        let numbered = "w123456 ".repeat(4);
        let parts: Vec<&str> = pieces(&numbered, 8).collect();
        assert_eq!(parts.concat(), numbered);
        assert_eq!(parts.len(), 3, "{parts:?}");
        assert_eq!(
            pieces("12 34 56", 1).count(),
            1,
            "no letter after the space"
        );
        assert_eq!(pieces("", 2).count(), 0);
    }
}
