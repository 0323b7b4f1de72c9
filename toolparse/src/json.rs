//! JSON helpers: finding where a JSON value ends in a stream (so marker text
//! inside a string never ends a call), strict parsing of argument objects,
//! and typing bare-text parameter values by the tool's schema.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// Where a JSON value (an object or array) ends, found incrementally.
///
/// INVARIANT: `scan` resumes where the previous call stopped, so feeding a
/// buffer that grows by one character at a time costs linear time overall.
#[derive(Debug, Clone, Default)]
pub(crate) struct ValueEnd {
    pos: usize,
    depth: u32,
    in_str: bool,
    esc: bool,
    started: bool,
    done: Option<usize>,
}

/// The state of a [`ValueEnd`] scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// The value ends just before this byte offset.
    Done(usize),
    /// The value has not ended within the text seen so far.
    Partial,
    /// The text does not begin with `{` or `[` (after whitespace), or closes
    /// more brackets than it opened.
    Invalid,
}

impl ValueEnd {
    /// Scans `text` (which must extend the text given before) for the end of
    /// the first value.
    pub(crate) fn scan(&mut self, text: &str) -> Scan {
        if let Some(end) = self.done {
            return Scan::Done(end);
        }
        let b = text.as_bytes();
        crate::scan::scanned(b.len().saturating_sub(self.pos));
        while self.pos < b.len() {
            let c = b[self.pos];
            self.pos += 1;
            if !self.started {
                match c {
                    b' ' | b'\t' | b'\n' | b'\r' => continue,
                    b'{' | b'[' => {
                        self.started = true;
                        self.depth = 1;
                        continue;
                    }
                    _ => {
                        self.pos -= 1;
                        return Scan::Invalid;
                    }
                }
            }
            if self.in_str {
                if self.esc {
                    self.esc = false;
                } else if c == b'\\' {
                    self.esc = true;
                } else if c == b'"' {
                    self.in_str = false;
                }
                continue;
            }
            match c {
                b'"' => self.in_str = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        self.done = Some(self.pos);
                        return Scan::Done(self.pos);
                    }
                }
                _ => {}
            }
        }
        Scan::Partial
    }

    /// Whether the scan is inside a JSON string right now.
    #[allow(dead_code)] // used by format machines still to land
    pub(crate) fn in_string(&self) -> bool {
        self.in_str
    }
}

/// Why text is not a strict JSON object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotObject(pub(crate) String);

/// Parses strict JSON (no duplicate keys, no trailing text) into a value.
pub(crate) fn strict_value(text: &str) -> Result<Value, NotObject> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = StrictSeed.deserialize(&mut de).map_err(|e| NotObject(e.to_string()))?;
    de.end().map_err(|e| NotObject(e.to_string()))?;
    Ok(v)
}

/// Parses strict JSON that must be an object.
pub(crate) fn strict_object(text: &str) -> Result<Map<String, Value>, NotObject> {
    match strict_value(text)? {
        Value::Object(m) => Ok(m),
        other => Err(NotObject(format!("expected an object, found {}", kind(&other)))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Arguments as they go out: the model's own text when it is already a strict
/// JSON object (so streamed fragments add up to it), else a serialization.
pub(crate) fn object_text(raw: &str) -> Result<String, NotObject> {
    let raw = raw.trim();
    strict_object(raw)?;
    Ok(raw.to_owned())
}

/// Serializes a map as compact JSON text.
pub(crate) fn to_text(map: &Map<String, Value>) -> String {
    Value::Object(map.clone()).to_string()
}

struct StrictSeed;

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number is not finite"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictSeed)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(de::Error::custom(format!("duplicate key {k:?}")));
            }
            let v = map.next_value_seed(StrictSeed)?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

/// A JSON Schema type name, as tools declare their parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonType {
    /// `"string"`
    String,
    /// `"integer"`
    Integer,
    /// `"number"`
    Number,
    /// `"boolean"`
    Boolean,
    /// `"object"`
    Object,
    /// `"array"`
    Array,
    /// `"null"`
    Null,
}

impl JsonType {
    /// The type for a JSON Schema type name, if it is one.
    pub fn from_name(name: &str) -> Option<JsonType> {
        Some(match name {
            "string" => JsonType::String,
            "integer" => JsonType::Integer,
            "number" => JsonType::Number,
            "boolean" => JsonType::Boolean,
            "object" => JsonType::Object,
            "array" => JsonType::Array,
            "null" => JsonType::Null,
            _ => return None,
        })
    }

    /// Whether `v` is of this type (an integer may be written `3.0`).
    pub(crate) fn accepts(self, v: &Value) -> bool {
        match self {
            JsonType::String => v.is_string(),
            JsonType::Integer => {
                v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0)
            }
            JsonType::Number => v.is_number(),
            JsonType::Boolean => v.is_boolean(),
            JsonType::Object => v.is_object(),
            JsonType::Array => v.is_array(),
            JsonType::Null => v.is_null(),
        }
    }
}

/// Types a parameter value that the format writes as bare text.
///
/// With declared types, the first declared type the text parses as wins
/// (a string type takes the text verbatim). Without a declaration the text
/// is kept as a string unless it is a JSON object or array.
pub(crate) fn coerce(text: &str, types: &[JsonType]) -> Value {
    if types.is_empty() {
        let t = text.trim();
        if t.starts_with('{') || t.starts_with('[') {
            if let Ok(v) = strict_value(t) {
                return v;
            }
        }
        return Value::String(text.to_owned());
    }
    // A declared string wins over everything when it is the only choice.
    if types == [JsonType::String] {
        return Value::String(text.to_owned());
    }
    let t = text.trim();
    for ty in types {
        match ty {
            JsonType::String => {}
            JsonType::Null if t == "null" || t == "None" => return Value::Null,
            JsonType::Boolean => match t {
                "true" | "True" => return Value::Bool(true),
                "false" | "False" => return Value::Bool(false),
                _ => {}
            },
            _ => {
                if let Ok(v) = strict_value(t) {
                    if ty.accepts(&v) {
                        return v;
                    }
                }
            }
        }
    }
    if types.contains(&JsonType::String) {
        return Value::String(text.to_owned());
    }
    // Nothing fits: keep JSON when the text is JSON, else the text.
    strict_value(t).unwrap_or_else(|_| Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_end_skips_strings() {
        let mut s = ValueEnd::default();
        let t = r#" {"a": "}</tool_call>\"}", "b": [1, {"c": 2}]} tail"#;
        let Scan::Done(end) = s.scan(t) else { panic!("not done") };
        assert_eq!(&t[end..], " tail");
    }

    #[test]
    fn value_end_is_incremental() {
        let t = r#"{"a": "x\"}", "b": {}}"#;
        let mut s = ValueEnd::default();
        for i in 1..t.len() {
            assert_eq!(s.scan(&t[..i]), Scan::Partial, "at {i}");
        }
        assert_eq!(s.scan(t), Scan::Done(t.len()));
    }

    #[test]
    fn strict_rejects_duplicates_and_constants() {
        assert!(strict_object(r#"{"a": 1, "a": 2}"#).is_err());
        assert!(strict_object(r#"{"a": NaN}"#).is_err());
        assert!(strict_object(r#"{"a": 1} x"#).is_err());
        assert!(strict_object(r#"[1]"#).is_err());
        assert!(strict_object(r#"{"a": {"b": [1, 2.5, null]}}"#).is_ok());
    }

    #[test]
    fn coercion_follows_the_schema() {
        use JsonType::*;
        assert_eq!(coerce("42", &[Integer]), Value::from(42));
        assert_eq!(coerce("42", &[String]), Value::from("42"));
        assert_eq!(coerce("true", &[Boolean]), Value::Bool(true));
        assert_eq!(coerce("0.5", &[Number]), Value::from(0.5));
        assert_eq!(coerce(r#"{"a": 1}"#, &[Object]), serde_json::json!({"a": 1}));
        assert_eq!(coerce("hello", &[]), Value::from("hello"));
        assert_eq!(coerce("[1, 2]", &[]), serde_json::json!([1, 2]));
        assert_eq!(coerce("abc", &[Integer]), Value::from("abc"));
    }
}
