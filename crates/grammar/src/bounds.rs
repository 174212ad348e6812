//! What a JSON schema must satisfy before it is compiled: bounded nesting and size, and
//! at least one finite value.
//!
//! The grammar engine compiles a schema recursively, so a deep schema (nested inline, or
//! through a chain of `$ref`s) or one with thousands of required properties takes stack
//! in proportion; bounded here, it compiles on [`crate::COMPILE_STACK`] with a wide
//! margin. The bounds are far beyond what agents send (OpenAI's structured outputs
//! allow 10 levels of nesting and 5,000 properties). A schema that only an endless value
//! satisfies (an object that requires itself) would let a reply run until its token
//! limit without ever being valid JSON: it is refused as well.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::{GrammarError, Result};

/// Nesting of a schema's JSON (objects and arrays), counted through `$ref`s as if each
/// were written out where it is used (once per path: a recursive schema counts its
/// cycle once).
pub const MAX_SCHEMA_DEPTH: usize = 256;

/// Properties (named in `properties` or `required`) over the whole schema.
pub const MAX_SCHEMA_PROPERTIES: usize = 10_000;

/// Checks `schema` against the bounds above and that some finite value satisfies it.
pub fn check_schema(schema: &Value) -> Result<()> {
    let n_properties = count_properties(schema);
    if n_properties > MAX_SCHEMA_PROPERTIES {
        return Err(GrammarError::Invalid(format!(
            "the schema names {n_properties} properties; at most {MAX_SCHEMA_PROPERTIES} are allowed"
        )));
    }
    let mut depths = HashMap::new();
    if depth(schema, schema, 0, &mut depths) > MAX_SCHEMA_DEPTH {
        return Err(GrammarError::Invalid(format!(
            "the schema nests more than {MAX_SCHEMA_DEPTH} levels deep (counting its $refs \
             where they are used)"
        )));
    }
    if !has_finite_value(schema) {
        return Err(GrammarError::Invalid(
            "nothing can satisfy the schema: every value it allows contains itself without end"
                .to_string(),
        ));
    }
    Ok(())
}

/// The properties named anywhere in `value`, counted iteratively.
fn count_properties(value: &Value) -> usize {
    let mut n = 0;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                let named = o
                    .get("properties")
                    .and_then(Value::as_object)
                    .map_or(0, Map::len);
                let required = o
                    .get("required")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                n += named.max(required);
                stack.extend(o.values());
            }
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
    n
}

/// The value a local `$ref` (`#`, `#/$defs/x`, any JSON pointer into the root) points to.
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

/// `value`'s nesting below `level`, through `$ref`s; stops counting past the bound, so
/// the recursion is at most [`MAX_SCHEMA_DEPTH`] + 1 frames. `depths` memoises each
/// reference's depth (a shared definition is measured once) and marks those being
/// measured (a cycle adds nothing).
fn depth<'a>(
    root: &'a Value,
    value: &'a Value,
    level: usize,
    depths: &mut HashMap<&'a str, Option<usize>>,
) -> usize {
    if level > MAX_SCHEMA_DEPTH {
        return level;
    }
    let children: Box<dyn Iterator<Item = &Value>> = match value {
        Value::Object(o) => Box::new(o.values()),
        Value::Array(a) => Box::new(a.iter()),
        _ => return level,
    };
    let mut deepest = level + 1;
    if let Some(reference) = value.get("$ref").and_then(Value::as_str) {
        let below = match depths.get(reference) {
            Some(Some(d)) => *d,
            Some(None) => 0,
            None => match resolve(root, reference) {
                Some(target) => {
                    depths.insert(reference, None);
                    let d = depth(root, target, 0, depths);
                    depths.insert(reference, Some(d));
                    d
                }
                None => 0,
            },
        };
        deepest = deepest.max(level + below);
    }
    for child in children {
        deepest = deepest.max(depth(root, child, level + 1, depths));
        if deepest > MAX_SCHEMA_DEPTH {
            break;
        }
    }
    deepest
}

/// Whether some finite JSON value satisfies `schema`, as far as `$ref`s, required
/// properties, minimum items and the combinators tell: the least fixpoint over the
/// schema's references, starting from "no reference has a finite value".
fn has_finite_value(root: &Value) -> bool {
    let mut references: Vec<&str> = Vec::new();
    let mut stack = vec![root];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                if let Some(r) = o.get("$ref").and_then(Value::as_str) {
                    if !references.contains(&r) {
                        references.push(r);
                    }
                }
                stack.extend(o.values());
            }
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
    let mut finite: HashMap<&str, bool> = references.iter().map(|&r| (r, false)).collect();
    loop {
        let mut changed = false;
        for &r in &references {
            if finite[r] {
                continue;
            }
            // A reference that leads outside the document is the grammar engine's to judge.
            let now = resolve(root, r).is_none_or(|target| finite_under(target, &finite));
            if now {
                finite.insert(r, true);
                changed = true;
            }
        }
        if !changed {
            return finite_under(root, &finite);
        }
    }
}

/// Whether `schema` has a finite value when the references marked in `finite` do.
fn finite_under(schema: &Value, finite: &HashMap<&str, bool>) -> bool {
    let Value::Object(o) = schema else {
        // `true`, or a non-schema the grammar engine will refuse on its own.
        return schema != &Value::Bool(false);
    };
    let each = |key: &str| o.get(key).and_then(Value::as_array);
    if let Some(r) = o.get("$ref").and_then(Value::as_str) {
        if !finite.get(r).copied().unwrap_or(true) {
            return false;
        }
    }
    if each("allOf").is_some_and(|all| !all.iter().all(|s| finite_under(s, finite))) {
        return false;
    }
    for key in ["anyOf", "oneOf"] {
        if each(key).is_some_and(|any| !any.iter().any(|s| finite_under(s, finite))) {
            return false;
        }
    }
    // A type other than object or array needs no nested value.
    let types: Vec<&str> = match o.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if types.iter().any(|t| *t != "object" && *t != "array") {
        return true;
    }
    let object = types.contains(&"object")
        || (types.is_empty() && (o.contains_key("properties") || o.contains_key("required")));
    if object {
        let properties = o.get("properties").and_then(Value::as_object);
        let others = o.get("additionalProperties");
        let required = o.get("required").and_then(Value::as_array);
        let all_finite = required
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .all(
                |name| match properties.and_then(|p| p.get(name)).or(others) {
                    Some(s) => finite_under(s, finite),
                    None => true,
                },
            );
        if !all_finite {
            return false;
        }
    }
    let min_items = o.get("minItems").and_then(Value::as_u64).unwrap_or(0);
    if types.contains(&"array") && min_items > 0 {
        let prefix = each("prefixItems").map_or(&[][..], Vec::as_slice);
        let fixed = prefix.iter().take(min_items as usize);
        if !fixed.clone().all(|s| finite_under(s, finite)) {
            return false;
        }
        if (prefix.len() as u64) < min_items {
            if let Some(items) = o.get("items").filter(|i| i.is_object()) {
                return finite_under(items, finite);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refused(schema: &Value) -> String {
        check_schema(schema).unwrap_err().to_string()
    }

    #[test]
    fn nesting_is_counted_through_references_and_bounded() {
        let nested = |n: usize| {
            let mut defs = Map::new();
            for i in 0..n {
                let next = format!("#/$defs/d{}", i + 1);
                defs.insert(
                    format!("d{i}"),
                    json!({"type": "object", "properties": {"x": {"$ref": next}}, "required": ["x"]}),
                );
            }
            defs.insert(format!("d{n}"), json!({"type": "string"}));
            json!({"$defs": defs, "$ref": "#/$defs/d0"})
        };
        // Three JSON levels per object level.
        assert!(check_schema(&nested(60)).is_ok());
        assert!(refused(&nested(250)).contains("more than 256 levels"));
        // A definition used many times is measured once (no exponential walk).
        let mut defs = Map::new();
        for i in 0..60 {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                json!({"anyOf": [{"$ref": next}, {"$ref": next}]}),
            );
        }
        defs.insert("d60".into(), json!({"type": "integer"}));
        assert!(check_schema(&json!({"$defs": defs, "$ref": "#/$defs/d0"})).is_ok());
    }

    #[test]
    fn properties_are_bounded_over_the_whole_schema() {
        let object = |n: usize| {
            let names: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
            let props: Map<String, Value> = names
                .iter()
                .map(|n| (n.clone(), json!({"type": "integer"})))
                .collect();
            json!({"type": "object", "properties": props, "required": names})
        };
        assert!(check_schema(&object(5_000)).is_ok());
        assert!(refused(&object(10_001)).contains("10001 properties"));
        let two = json!({"anyOf": [object(6_000), object(6_000)]});
        assert!(refused(&two).contains("12000 properties"));
    }

    #[test]
    fn a_schema_only_an_endless_value_satisfies_is_refused() {
        let endless = [
            json!({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}),
            json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
            json!({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}}, "$ref": "#/$defs/n"}),
            json!({"type": "object", "properties": {"a": {"allOf": [{"$ref": "#"}]}}, "required": ["a"]}),
        ];
        for schema in &endless {
            assert!(refused(schema).contains("nothing can satisfy"), "{schema}");
        }
        let finite = [
            // Recursion with a way out: optional, an alternative, or an empty array.
            json!({"type": "object", "properties": {"a": {"$ref": "#"}}}),
            json!({"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["a"]}),
            json!({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}),
            json!({"type": ["object", "null"], "properties": {"a": {"$ref": "#"}}, "required": ["a"]}),
            json!({"$ref": "https://example.com/remote.json"}),
        ];
        for schema in &finite {
            assert!(check_schema(schema).is_ok(), "{schema}");
        }
    }
}
