//! The `tojson` filter as transformers defines it for chat templates: Python's
//! `json.dumps(value, ensure_ascii=False, indent=indent, separators=separators,
//! sort_keys=sort_keys)`. minijinja's own `tojson` writes compact, HTML-escaped JSON
//! (`<` as `\u003c`), which would render tool schemas into different tokens than the
//! model saw in training.

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};

/// `value` as Python's `json.dumps(value, ensure_ascii=False)` writes it (`", "` and
/// `": "`, keys in order): how templates print JSON, and so how models read it.
pub fn python_json(value: &serde_json::Value) -> String {
    let style = Style {
        indent: None,
        item_sep: ", ".to_string(),
        key_sep: ": ".to_string(),
        sort_keys: false,
    };
    let mut out = String::new();
    style.write(value, 0, &mut out);
    out
}

/// `value | tojson(indent=None, separators=None, sort_keys=False)`.
pub fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(if let Some(s) = v.as_str() {
            s.to_string()
        } else {
            let n = i64::try_from(v.clone())
                .map_err(|_| bad("tojson: indent must be an integer or a string"))?;
            " ".repeat(n.clamp(0, 64) as usize)
        }),
    };
    let separators: Option<Value> = kwargs.get("separators")?;
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let pair: Vec<Value> = v
                .try_iter()
                .map_err(|_| bad("tojson: separators must be a pair of strings"))?
                .collect();
            match pair.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => return Err(bad("tojson: separators must be a pair of strings")),
            }
        }
        // Python's defaults: a trailing space after ',' only without indentation.
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|e| bad(&format!("tojson: the value is not JSON: {e}")))?;
    let style = Style {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    // Safe from auto-escaping, as transformers marks it.
    Ok(Value::from_safe_string(out))
}

fn bad(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.to_string())
}

struct Style {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl Style {
    fn write(&self, value: &serde_json::Value, depth: usize, out: &mut String) {
        use serde_json::Value as J;
        match value {
            J::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separate(i, depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push(']');
            }
            J::Object(map) if !map.is_empty() => {
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (key, item)) in entries.into_iter().enumerate() {
                    self.separate(i, depth + 1, out);
                    write_string(key, out);
                    out.push_str(&self.key_sep);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push('}');
            }
            J::String(s) => write_string(s, out),
            // Numbers, booleans, null, `[]` and `{}` are written as serde_json writes them,
            // which is Python's spelling (`1.0` stays `1.0`).
            other => out.push_str(&other.to_string()),
        }
    }

    /// Before item `i` of a container at `depth`: the item separator, then a newline
    /// and indentation when indenting.
    fn separate(&self, i: usize, depth: usize, out: &mut String) {
        if i > 0 {
            out.push_str(&self.item_sep);
        }
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
    }

    fn close(&self, depth: usize, out: &mut String) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
    }
}

/// A JSON string with Python's escapes and `ensure_ascii=False`: only `"`, `\` and
/// control characters are escaped.
fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use minijinja::{context, Environment};

    fn render(template: &str, value: serde_json::Value) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        env.render_str(template, context! { v => value }).unwrap()
    }

    #[test]
    fn writes_what_python_json_dumps_writes() {
        // Expected strings are Python 3's `json.dumps(v, ensure_ascii=False, ...)`.
        let v = serde_json::json!({"b": [1, 2.5, "x<y>&'\"\n"], "a": {}, "é": [], "n": null, "t": true});
        assert_eq!(
            render("{{ v | tojson }}", v.clone()),
            r#"{"b": [1, 2.5, "x<y>&'\"\n"], "a": {}, "é": [], "n": null, "t": true}"#
        );
        assert_eq!(
            render("{{ v | tojson(sort_keys=true) }}", v.clone()),
            r#"{"a": {}, "b": [1, 2.5, "x<y>&'\"\n"], "n": null, "t": true, "é": []}"#
        );
        assert_eq!(
            render(
                "{{ v | tojson(indent=2) }}",
                serde_json::json!({"a": [1, {"b": 2}]})
            ),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ]\n}"
        );
        assert_eq!(
            render(
                "{{ v | tojson(separators=(',', ':')) }}",
                serde_json::json!({"a": [1, 2]})
            ),
            r#"{"a":[1,2]}"#
        );
    }
}
