//! The tools offered to the model, reduced to what parsing needs: names and
//! the declared types of top-level parameters (to type bare-text values).

use crate::json::JsonType;
use serde_json::Value;

/// One offered tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolSpec {
    /// The function name the model calls.
    pub name: String,
    /// Top-level parameters with their declared types (empty: undeclared).
    pub params: Vec<ParamSpec>,
}

/// One top-level parameter of a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    /// The parameter name.
    pub name: String,
    /// The declared JSON types, in declaration order.
    pub types: Vec<JsonType>,
}

impl ToolSpec {
    /// A tool without declared parameters.
    pub fn new(name: impl Into<String>) -> ToolSpec {
        ToolSpec { name: name.into(), params: Vec::new() }
    }

    /// Adds a parameter with its declared types.
    pub fn param(mut self, name: impl Into<String>, types: &[JsonType]) -> ToolSpec {
        self.params.push(ParamSpec { name: name.into(), types: types.to_vec() });
        self
    }

    /// Reads a tool from its JSON Schema `parameters` object. Types it does
    /// not understand are left undeclared; nothing here can fail.
    pub fn from_json_schema(name: impl Into<String>, parameters: &Value) -> ToolSpec {
        let mut spec = ToolSpec::new(name);
        let Some(props) = parameters.get("properties").and_then(Value::as_object) else {
            return spec;
        };
        for (key, prop) in props {
            spec.params.push(ParamSpec { name: key.clone(), types: schema_types(prop) });
        }
        spec
    }

    /// Reads an OpenAI-style tool entry: `{"type": "function", "function":
    /// {"name", "parameters"}}` or the bare function object. `None` when it
    /// has no name.
    pub fn from_openai(tool: &Value) -> Option<ToolSpec> {
        let f = tool.get("function").unwrap_or(tool);
        let name = f.get("name")?.as_str()?;
        Some(ToolSpec::from_json_schema(name, f.get("parameters").unwrap_or(&Value::Null)))
    }

    /// The declared types of parameter `name` (empty when undeclared).
    pub fn types_of(&self, name: &str) -> &[JsonType] {
        self.params.iter().find(|p| p.name == name).map(|p| p.types.as_slice()).unwrap_or(&[])
    }
}

fn schema_types(prop: &Value) -> Vec<JsonType> {
    let mut out = Vec::new();
    match prop.get("type") {
        Some(Value::String(s)) => out.extend(JsonType::from_name(s)),
        Some(Value::Array(a)) => {
            out.extend(a.iter().filter_map(Value::as_str).filter_map(JsonType::from_name))
        }
        _ => {}
    }
    if out.is_empty() {
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = prop.get(key).and_then(Value::as_array) {
                for alt in alts {
                    out.extend(schema_types(alt));
                }
            }
        }
        if prop.get("enum").is_some() && out.is_empty() {
            if let Some(vals) = prop.get("enum").and_then(Value::as_array) {
                if vals.iter().all(Value::is_string) {
                    out.push(JsonType::String);
                }
            }
        }
    }
    out
}

/// The offered tools of one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tools(pub Vec<ToolSpec>);

impl Tools {
    /// The tool named `name`, if it was offered.
    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.0.iter().find(|t| t.name == name)
    }

    /// Declared types of `param` of tool `tool` (empty when unknown).
    pub fn types_of(&self, tool: &str, param: &str) -> &[JsonType] {
        self.get(tool).map(|t| t.types_of(param)).unwrap_or(&[])
    }
}
