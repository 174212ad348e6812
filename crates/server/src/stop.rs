//! Stop strings on streamed text: how much of the decoded text may be sent, matched
//! across token boundaries, with the tail that could still become a stop string held
//! back.

/// How far decoded text may be sent, given stop strings.
pub(crate) struct Release {
    pub send_to: usize,
    pub hit: bool,
    /// The stop string that was hit (not an `end_after` one).
    pub stop: Option<String>,
}

/// Text up to the first stop string (which ends generation and is never sent) or through
/// the first `end_after` string (which ends it and is sent), or else up to the longest
/// tail that could still grow into either, which is held back.
pub(crate) fn release_text(
    text: &str,
    sent: usize,
    stops: &[String],
    end_after: &[String],
) -> Release {
    // A stop can start before `sent` only if the held-back tail was shorter than it, which
    // the hold-back rule excludes; so searching from `sent` finds every complete one.
    let first_hit = stops
        .iter()
        .map(|s| (s, 0, true))
        .chain(end_after.iter().map(|s| (s, s.len(), false)))
        .filter_map(|(s, kept, is_stop)| {
            text[sent..]
                .find(s.as_str())
                .map(|p| (sent + p, kept, is_stop.then_some(s)))
        })
        .min();
    if let Some((at, kept, stop)) = first_hit {
        return Release {
            send_to: at + kept,
            hit: true,
            stop: stop.cloned(),
        };
    }
    let hold = stops
        .iter()
        .chain(end_after)
        .map(|s| {
            (1..s.len().min(text.len() - sent + 1))
                .rev()
                .find(|&l| {
                    s.is_char_boundary(l)
                        && text.is_char_boundary(text.len() - l)
                        && text.ends_with(&s[..l])
                })
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0);
    Release {
        send_to: text.len() - hold,
        hit: false,
        stop: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(text: &str, sent: usize, stops: &[&str]) -> (usize, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let r = release_text(text, sent, &stops, &[]);
        (r.send_to, r.hit)
    }

    #[test]
    fn end_after_strings_are_sent_and_end_generation() {
        let end = ["</tool_call>".to_string()];
        let r = release_text("a<tool_call>{}</tool", 0, &[], &end);
        assert_eq!((r.send_to, r.hit), (14, false), "'</tool' may be the end");
        let r = release_text("a<tool_call>{}</tool_call>\nmore", 0, &[], &end);
        assert_eq!((r.send_to, r.hit), (26, true));
        // Whichever comes first wins, a stop string before an end string included.
        let r = release_text("x STOP </tool_call>", 0, &["STOP".to_string()], &end);
        assert_eq!((r.send_to, r.hit), (2, true));
    }

    #[test]
    fn stop_strings_are_found_across_pieces_and_never_sent() {
        assert_eq!(
            release("Hello wor", 0, &["world!"]),
            (6, false),
            "'wor' may become 'world!'"
        );
        assert_eq!(release("Hello world!", 6, &["world!"]), (6, true));
        assert_eq!(release("abc", 0, &[]), (3, false));
        assert_eq!(
            release("a\nb", 0, &["\n", "b"]),
            (1, true),
            "the first stop wins"
        );
        assert_eq!(release("xEN", 1, &["END", "ENX"]), (1, false));
        // Held-back tails end on character boundaries.
        assert_eq!(release("caf\u{e9}", 0, &["\u{e9}t\u{e9}"]), (3, false));
        assert_eq!(release("x\u{e9}", 0, &["\u{e9}"]), (1, true));
    }
}
