//! The two parts of a call as the model writes it, read a character at a time: its head
//! (`{"name": "f", "arguments": `), which says which function is called, and its
//! arguments object, which streams out compacted as it is written.

/// What the start of a call's text shows so far.
#[derive(Debug, PartialEq)]
pub(super) enum Head {
    /// Could still become a call's head.
    Incomplete,
    /// Is not the head of a call of any known function.
    NotACall,
    /// A call of `name` whose arguments object starts `len` bytes in.
    Object { name: String, len: usize },
    /// A call of a known function whose arguments are not written as an object (a JSON
    /// string, say): only the whole call can be read.
    Other,
}

/// Reads `{"name": "<known name>", "arguments": ` at the start of `text`, whitespace
/// allowed between the JSON tokens as JSON allows it.
pub(super) fn read_head(text: &str, names: &[String]) -> Head {
    let mut at = 0;
    let mut name = "";
    for step in [
        Step::Literal("{"),
        Step::Literal("\"name\""),
        Step::Literal(":"),
        Step::Name,
        Step::Literal(","),
        Step::Literal("\"arguments\""),
        Step::Literal(":"),
    ] {
        at += skip_whitespace(&text[at..]);
        let rest = &text[at..];
        match step {
            Step::Literal(literal) => {
                if rest.len() < literal.len() {
                    if !literal.starts_with(rest) {
                        return Head::NotACall;
                    }
                    return Head::Incomplete;
                }
                if !rest.starts_with(literal) {
                    return Head::NotACall;
                }
                at += literal.len();
            }
            Step::Name => {
                let Some(quoted) = rest.strip_prefix('"') else {
                    return if rest.is_empty() {
                        Head::Incomplete
                    } else {
                        Head::NotACall
                    };
                };
                match quoted.find('"') {
                    None if names.iter().any(|n| n.starts_with(quoted)) => return Head::Incomplete,
                    None => return Head::NotACall,
                    Some(end) if names.iter().any(|n| n == &quoted[..end]) => {
                        name = &quoted[..end];
                        at += end + 2;
                    }
                    Some(_) => return Head::NotACall,
                }
            }
        }
    }
    at += skip_whitespace(&text[at..]);
    match text[at..].chars().next() {
        None => Head::Incomplete,
        Some('{') => Head::Object {
            name: name.to_string(),
            len: at,
        },
        Some(_) => Head::Other,
    }
}

enum Step {
    Literal(&'static str),
    Name,
}

fn skip_whitespace(text: &str) -> usize {
    text.len() - text.trim_start_matches([' ', '\t', '\n', '\r']).len()
}

/// A JSON value read a character at a time and written back without the whitespace
/// between its tokens: `{"city": "Zürich"}` streams out as `{"city":"Zürich"}`, in the
/// same pieces whichever way the text was split.
#[derive(Debug, Default)]
pub(super) struct CompactJson {
    depth: usize,
    in_string: bool,
    escaped: bool,
    done: bool,
}

impl CompactJson {
    /// Whether the value has closed.
    pub(super) fn is_done(&self) -> bool {
        self.done
    }

    /// Reads `text` up to the end of the value: the compacted text and the bytes read.
    pub(super) fn read(&mut self, text: &str) -> (String, usize) {
        let mut out = String::with_capacity(text.len());
        for (i, c) in text.char_indices() {
            if self.done {
                return (out, i);
            }
            if self.in_string {
                out.push(c);
                match c {
                    _ if self.escaped => self.escaped = false,
                    '\\' => self.escaped = true,
                    '"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                ' ' | '\t' | '\n' | '\r' => continue,
                '"' => self.in_string = true,
                '{' | '[' => self.depth += 1,
                '}' | ']' => {
                    self.depth = self.depth.saturating_sub(1);
                    self.done = self.depth == 0;
                }
                _ => {}
            }
            out.push(c);
        }
        (out, text.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["get_weather".into(), "now".into()]
    }

    #[test]
    fn heads_are_read_as_far_as_they_go() {
        let head = "{\n  \"name\" : \"get_weather\",\"arguments\":  {\"city\": 1}}";
        let start = head.find("{\"city").unwrap();
        for cut in 0..start {
            assert_eq!(read_head(&head[..cut], &names()), Head::Incomplete, "{cut}");
        }
        assert_eq!(
            read_head(head, &names()),
            Head::Object {
                name: "get_weather".into(),
                len: start
            }
        );
        for text in [
            "{\"answer\": 1}",
            "[1]",
            "{\"name\": \"launch\"",
            "{\"name\": \"nowhere\"}",
            "{\"name\": \"now\", \"args\": {}}",
        ] {
            assert_eq!(read_head(text, &names()), Head::NotACall, "{text}");
        }
        assert_eq!(
            read_head("{\"name\": \"now\", \"arguments\": \"{}\"}", &names()),
            Head::Other
        );
    }

    #[test]
    fn json_is_compacted_outside_strings_and_stops_at_the_value_end() {
        let text = "{ \"a b\" : [1, {\"c\\\"}\": \" } \"}] }\n</tool_call>";
        let mut scan = CompactJson::default();
        let (out, used) = scan.read(text);
        assert!(scan.is_done());
        assert_eq!(out, "{\"a b\":[1,{\"c\\\"}\":\" } \"}]}");
        assert_eq!(&text[used..], "\n</tool_call>");
    }
}
