//! The call of the formats that write arguments one key at a time, as
//! markup around each value instead of one JSON object: GLM
//! (`<arg_key>k</arg_key><arg_value>v</arg_value>`), Qwen3 XML
//! (`<parameter=k>v</parameter>`), Kimi K3 (`<|open|>argument key="k"<|sep|>v`)
//! and DeepSeek DSML (`<｜DSML｜parameter name="k">v</｜DSML｜parameter>`).
//!
//! ```text
//! <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>
//! ```
//!
//! A [`KeyedCall`] is started once the name is known, gathers the typed
//! values into a JSON object in the order they came, reports each as an
//! argument fragment (`{"city":"Paris"`, then `,"days":3`, then `}`), and
//! ends as a strict JSON object. What a repeated key means is the format's
//! choice: [`KeyedCall::insert`] refuses it, [`KeyedCall::replace`] keeps
//! the last value.

use crate::cx::Cx;
use crate::json;
use serde_json::{Map, Value};

/// A started call whose arguments arrive one key at a time.
#[derive(Debug)]
pub(crate) struct KeyedCall {
    name: String,
    args: Map<String, Value>,
}

/// A key the call has already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Repeated;

impl KeyedCall {
    /// Starts the call `name` (reported as [`crate::Event::CallStart`]).
    pub(crate) fn start(name: &str, cx: &mut Cx) -> KeyedCall {
        cx.start_call(None, name);
        KeyedCall { name: name.to_owned(), args: Map::new() }
    }

    /// The function name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Whether no argument came yet.
    pub(crate) fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    /// Whether `key` has a value already.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.args.contains_key(key)
    }

    /// Adds `key: value` and reports it as a fragment; a repeated key is
    /// refused and the call is left as it was.
    pub(crate) fn insert(
        &mut self,
        key: String,
        value: Value,
        cx: &mut Cx,
    ) -> Result<(), Repeated> {
        if self.args.contains_key(&key) {
            return Err(Repeated);
        }
        let sep = if self.args.is_empty() { "{" } else { "," };
        cx.call_args(&format!("{sep}{}:{value}", Value::from(key.as_str())));
        self.args.insert(key, value);
        Ok(())
    }

    /// Adds `key: value`; a repeated key takes the new value (its fragment
    /// was reported already, the complete arguments have the new one).
    pub(crate) fn replace(&mut self, key: String, value: Value, cx: &mut Cx) {
        if let Some(old) = self.args.get_mut(&key) {
            *old = value;
        } else {
            let _ = self.insert(key, value, cx);
        }
    }

    /// The call is complete: its arguments close and it is reported.
    pub(crate) fn finish(self, cx: &mut Cx) {
        cx.call_args(if self.args.is_empty() { "{}" } else { "}" });
        cx.end_call(json::to_text(&self.args));
    }
}
