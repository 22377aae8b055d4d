//! Checks the requests the gateway sends to BigQuery against Google's own description of the
//! REST API, the BigQuery v2 discovery document (`bigquery.v2.json`, shipped in PyPI's
//! `google-api-python-client` under `googleapiclient/discovery_cache/documents/`; `make test`
//! exports its path as `$FILAMENT_BIGQUERY_DISCOVERY`).
//!
//! Why: the emulator is lenient. It ignores fields it does not know, takes numbers where BigQuery
//! wants strings and keeps output-only fields, so a request it answers may be one that BigQuery
//! rejects or misreads. [`Discovery::check_request`] reports, for one request:
//! - a method and path that no discovery method has (matched on `flatPath`, with or without the
//!   `servicePath` `/bigquery/v2/`; each `{...}` takes one non-empty segment);
//! - undeclared query parameters, values not of the declared type or `enum`, a parameter given
//!   twice that is not `repeated`, missing required ones, a missing or unexpected body;
//! - what [`Discovery::check_body`] finds in the body against the method's request schema:
//!   unknown fields at any depth (through `$ref`, `items` and `additionalProperties`), wrong JSON
//!   types, values outside an `enum`, output-only fields.
//!
//! Each problem names its JSON path (`Table.schema.fields[2].roundingMode: ...`). Google's JSON
//! conventions followed here, which the document does not spell out:
//! - `int64`/`uint64` (`"type": "string", "format": "int64"`) are strings holding a decimal
//!   integer, as Google's clients send them; `int32`/`uint32` are JSON numbers; `double`/`float`
//!   are numbers or `"NaN"`, `"Infinity"`, `"-Infinity"`. Other formats (`byte`,
//!   `google-datetime`, ...) are checked as plain strings. `deprecated` fields are accepted.
//! - `null` means unset: accepted for any field and map value (Google's Python client deletes a
//!   label by sending it as `null`), refused as an array element.
//! - Output-only: the document marks 290 fields `readOnly: true`, nearly all also described
//!   "Output only. ..." (`JobConfiguration.jobType` only by its description; older documents
//!   wrote "[Output-only]"). Any of these marks counts.
//! - System parameters (the document's top-level `parameters`: `alt`, `fields`, ...) are accepted
//!   on every method, also with a `$` (`$alt`), a synonym Google accepts. With
//!   `alt=json;enum-encoding=int`, which google-cloud-rust adds to every call, an enum value may be
//!   a number, read as its position in `enum` (its proto number, for the enums the gateway sends).
//! - A query parameter declared in snake_case (`autodetect_schema`) also answers to its
//!   lowerCamelCase JSON name (`autodetectSchema`), which google-cloud-rust sends.

use std::fmt;

use serde_json::{Map, Value, json};

/// The variable `make test` sets to the path of `bigquery.v2.json`.
const VARIABLE: &str = "FILAMENT_BIGQUERY_DISCOVERY";

/// A parsed discovery document (parsing BigQuery's takes a few milliseconds).
pub struct Discovery {
    document: Value,
}

impl fmt::Debug for Discovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Discovery").field("revision", &self.document["revision"]).finish_non_exhaustive()
    }
}

impl Discovery {
    /// The document at `$FILAMENT_BIGQUERY_DISCOVERY`; panics, saying how to run the suite, when
    /// the variable is unset or the file is not readable JSON.
    pub fn load() -> Discovery {
        let hint = "run the suite with `make test`, which provides BigQuery's discovery document and exports it";
        let path = std::env::var(VARIABLE).unwrap_or_else(|_| panic!("{VARIABLE} is not set: {hint}"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{VARIABLE}={path}: {e}: {hint}"));
        Discovery::from_json(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{VARIABLE}={path}: {e}: {hint}")))
    }

    /// A document already parsed (the tests build small ones).
    pub fn from_json(document: Value) -> Discovery {
        Discovery { document }
    }

    /// The id of the discovery method (`bigquery.tables.insert`) that `http_method` on `path`
    /// (`/bigquery/v2/projects/demo/datasets/raw/tables`, or without `/bigquery/v2`) calls.
    pub fn method_for(&self, http_method: &str, path: &str) -> Option<&str> {
        self.method(http_method, path)?["id"].as_str()
    }

    /// Every problem with one request, `path_and_query` as sent (`/bigquery/v2/...?location=US`)
    /// and `body` its JSON (`None` or `null` for none); empty when there is none.
    pub fn check_request(&self, http_method: &str, path_and_query: &str, body: Option<&Value>) -> Vec<String> {
        let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
        let Some(method) = self.method(http_method, path) else {
            return vec![format!("{http_method} {path}: no method of the discovery document has this method and path")];
        };
        let id = method["id"].as_str().unwrap_or("?");
        let pairs: Vec<(String, String)> = query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
            .map(|(name, value)| (percent_decode(name), percent_decode(value)))
            .collect();
        let int_enums = pairs.iter().any(|(name, value)| {
            (name == "alt" || name == "$alt") && value.split(';').any(|option| option == "enum-encoding=int")
        });

        let mut problems = Vec::new();
        let mut seen = Vec::new();
        for (name, value) in &pairs {
            let system = &self.document["parameters"];
            let found = parameter(&method["parameters"], name)
                .or_else(|| parameter(system, name))
                .or_else(|| parameter(system, name.strip_prefix('$')?));
            let Some((declared, spec)) = found else {
                problems.push(format!("{id}: unknown query parameter `{name}`"));
                continue;
            };
            let at = format!("{id}: query parameter `{name}`");
            if seen.contains(&declared) && spec["repeated"] != true {
                problems.push(format!("{at} is given more than once but is not repeated"));
            }
            seen.push(declared);
            // `alt` may carry Google's one option for its format: `json;enum-encoding=int`.
            let value = match value.split_once(';') {
                Some((format, "enum-encoding=int")) if declared == "alt" => format,
                _ => value,
            };
            if let Some(problem) = text_problem(spec, value, int_enums) {
                problems.push(format!("{at}: {problem}"));
            }
        }
        for (name, spec) in method["parameters"].as_object().into_iter().flatten() {
            if spec["required"] == true && spec["location"] == "query" && !seen.contains(&name.as_str()) {
                problems.push(format!("{id}: required query parameter `{name}` is missing"));
            }
        }

        match (method["request"]["$ref"].as_str(), body.filter(|body| !body.is_null())) {
            (Some(schema), Some(body)) => problems.extend(self.check(schema, body, int_enums)),
            (Some(schema), None) => problems.push(format!("{id}: takes a {schema} body, none was sent")),
            (None, Some(_)) => problems.push(format!("{id}: takes no body, one was sent")),
            (None, None) => {}
        }
        problems
    }

    /// Every problem with `value` as the instance of the document's schema `schema` (`"Table"`)
    /// that a request sends; enum values must be names (see the module's documentation).
    pub fn check_body(&self, schema: &str, value: &Value) -> Vec<String> {
        self.check(schema, value, false)
    }

    fn check(&self, schema: &str, value: &Value, int_enums: bool) -> Vec<String> {
        let mut body = Body { schemas: &self.document["schemas"], int_enums, problems: Vec::new() };
        body.check(&json!({ "$ref": schema }), value, schema);
        body.problems
    }

    /// The method whose `flatPath` matches `path`; of several, the one with the most literal text
    /// (`.../datasets/{datasetsId}:undelete` rather than `.../datasets/{datasetsId}`).
    fn method(&self, http_method: &str, path: &str) -> Option<&Value> {
        let path = path.split('?').next().unwrap_or(path).trim_start_matches('/');
        let service_path = self.document["servicePath"].as_str().filter(|prefix| !prefix.is_empty());
        let segments: Vec<&str> =
            service_path.and_then(|prefix| path.strip_prefix(prefix)).unwrap_or(path).split('/').collect();
        let mut methods = Vec::new();
        let mut resources = vec![&self.document["resources"]];
        while let Some(resource) = resources.pop() {
            for resource in resource.as_object().into_iter().flat_map(Map::values) {
                methods.extend(resource["methods"].as_object().into_iter().flat_map(Map::values));
                resources.push(&resource["resources"]);
            }
        }
        methods
            .into_iter()
            .filter(|method| method["httpMethod"].as_str().is_some_and(|m| m.eq_ignore_ascii_case(http_method)))
            .filter_map(|method| {
                let template = method["flatPath"].as_str().or(method["path"].as_str())?;
                let literal: usize = template.split('}').map(|piece| piece.split('{').next().unwrap_or("").len()).sum();
                template_matches(template, &segments).then_some((literal, method))
            })
            .max_by_key(|(literal, _)| *literal)
            .map(|(_, method)| method)
    }
}

/// Checks a JSON body against the document's `schemas`, collecting problems.
struct Body<'a> {
    schemas: &'a Value,
    int_enums: bool,
    problems: Vec<String>,
}

impl Body<'_> {
    /// Checks `value` against `spec` (a schema, or a property of one) at JSON path `path`.
    fn check(&mut self, spec: &Value, value: &Value, path: &str) {
        if let Some(name) = spec["$ref"].as_str() {
            match self.schemas.get(name) {
                Some(schema) => self.check(schema, value, path),
                None => self.problems.push(format!("{path}: the document has no schema {name}")),
            }
            return;
        }
        let kind = spec["type"].as_str().unwrap_or(if spec.get("properties").is_some() { "object" } else { "any" });
        let format = spec["format"].as_str().unwrap_or("");
        let problem = match (kind, value) {
            ("any", _) => None,
            ("object", Value::Object(fields)) => {
                self.check_object(spec, fields, path);
                None
            }
            ("array", Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::Null => self.problems.push(format!("{path}[{i}]: null is not allowed in an array")),
                        item => self.check(&spec["items"], item, &format!("{path}[{i}]")),
                    }
                }
                None
            }
            _ if spec.get("enum").is_some() => {
                (!is_enum_value(spec, value, self.int_enums)).then(|| format!("{value} is not one of {}", spec["enum"]))
            }
            ("string", Value::String(text)) if matches!(format, "int64" | "uint64") => text_problem(spec, text, false),
            ("string", Value::String(_)) | ("boolean", Value::Bool(_)) | ("number", Value::Number(_)) => None,
            ("number", Value::String(text)) if matches!(text.as_str(), "NaN" | "Infinity" | "-Infinity") => None,
            ("integer", Value::Number(number)) => {
                let fits = match format {
                    "uint32" => number.as_u64().is_some_and(|n| u32::try_from(n).is_ok()),
                    _ => number.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
                };
                (!fits).then(|| format!("{number} is not a {format}"))
            }
            _ => Some(mismatch(kind, format, value)),
        };
        if let Some(problem) = problem {
            self.problems.push(format!("{path}: {problem}"));
        }
    }

    fn check_object(&mut self, spec: &Value, fields: &Map<String, Value>, path: &str) {
        let properties = spec["properties"].as_object();
        let mut fields: Vec<_> = fields.iter().collect();
        fields.sort_by_key(|(name, _)| *name); // the same order with serde_json's `preserve_order`
        for (name, value) in fields {
            let at = format!("{path}.{name}");
            match (properties.and_then(|properties| properties.get(name)), spec.get("additionalProperties")) {
                _ if value.is_null() => {}
                (Some(property), _) if is_output_only(property) => {
                    self.problems.push(format!("{at}: output-only field set in a request"));
                }
                (Some(property), _) | (None, Some(property)) => self.check(property, value, &at),
                (None, None) => {
                    let of = spec["id"].as_str().map_or(String::new(), |id| format!(" of {id}"));
                    let mut known: Vec<&str> = properties.into_iter().flat_map(Map::keys).map(String::as_str).collect();
                    known.sort_unstable();
                    self.problems.push(format!("{at}: unknown field; the fields{of} are {}", known.join(", ")));
                }
            }
        }
    }
}

/// Whether a `/`-split path matches a `flatPath` template such as
/// `projects/{projectsId}/datasets/{datasetsId}:undelete` (a `{...}` matches one non-empty segment).
fn template_matches(template: &str, segments: &[&str]) -> bool {
    let parts: Vec<&str> = template.split('/').collect();
    parts.len() == segments.len()
        && parts.iter().zip(segments).all(|(part, segment)| match part.split_once('{') {
            None => part == segment,
            Some((prefix, rest)) => {
                let suffix = rest.split_once('}').map_or("", |(_, suffix)| suffix);
                segment.len() > prefix.len() + suffix.len() && segment.starts_with(prefix) && segment.ends_with(suffix)
            }
        })
}

/// The query parameter `name` of `parameters` (declared name and spec); a snake_case declared
/// name also answers to its lowerCamelCase spelling.
fn parameter<'a>(parameters: &'a Value, name: &str) -> Option<(&'a str, &'a Value)> {
    let lower_camel = |declared: &str| {
        let mut words = declared.split('_');
        let first = words.next().unwrap_or("").to_string();
        words.fold(first, |camel, word| {
            let mut chars = word.chars();
            camel + &chars.next().map(|c| c.to_ascii_uppercase().to_string()).unwrap_or_default() + chars.as_str()
        })
    };
    let (declared, spec) = parameters
        .as_object()?
        .iter()
        .find(|(declared, spec)| spec["location"] == "query" && (*declared == name || lower_camel(declared) == name))?;
    Some((declared, spec))
}

/// What is wrong with `text` as the value of `spec` written as text (a query parameter's value,
/// or the string holding an `int64`), if anything.
fn text_problem(spec: &Value, text: &str, int_enums: bool) -> Option<String> {
    if spec.get("enum").is_some() {
        let position = text.parse::<u64>().map_or(Value::Null, Value::from);
        let valid = is_enum_value(spec, &Value::from(text), false) || is_enum_value(spec, &position, int_enums);
        return (!valid).then(|| format!("{text:?} is not one of {}", spec["enum"]));
    }
    let (valid, wanted) = match (spec["type"].as_str().unwrap_or(""), spec["format"].as_str().unwrap_or("")) {
        ("integer", "uint32") => (text.parse::<u32>().is_ok(), "a decimal uint32"),
        ("integer", _) => (text.parse::<i32>().is_ok(), "a decimal int32"),
        ("string", "int64") => (text.parse::<i64>().is_ok(), "a decimal int64"),
        ("string", "uint64") => (text.parse::<u64>().is_ok(), "a decimal uint64"),
        ("number", _) => (text.parse::<f64>().is_ok(), "a number"),
        ("boolean", _) => (text == "true" || text == "false", "true or false"),
        _ => (true, ""),
    };
    (!valid).then(|| format!("{text:?} is not {wanted}"))
}

/// Whether `value` is one of `spec`'s enum values; with `int_enums`, a number counts as its
/// position in the list.
fn is_enum_value(spec: &Value, value: &Value, int_enums: bool) -> bool {
    let values = spec["enum"].as_array().map_or(&[][..], Vec::as_slice);
    values.contains(value) || (int_enums && value.as_u64().is_some_and(|n| n < values.len() as u64))
}

fn is_output_only(property: &Value) -> bool {
    let description = property["description"].as_str().unwrap_or("").trim_start();
    property["readOnly"] == true || description.starts_with("Output only.") || description.starts_with("[Output-only]")
}

/// The problem of `value` not being of JSON type `kind` (with `format`) at all.
fn mismatch(kind: &str, format: &str, value: &Value) -> String {
    let expected = match (kind, format) {
        ("string", "int64" | "uint64") => format!("a string holding a decimal {format} (Google's JSON for {format})"),
        ("integer", _) => format!("a JSON number ({format})"),
        ("boolean", _) => "true or false".to_string(),
        _ => format!("a JSON {kind}"),
    };
    let got = match value {
        Value::Object(_) => "an object".to_string(),
        Value::Array(_) => "an array".to_string(),
        _ => value.to_string(),
    };
    format!("expected {expected}, got {got}")
}

/// `text` with `+` as a space and `%XX` escapes decoded (malformed escapes kept as they are).
fn percent_decode(text: &str) -> String {
    let (bytes, mut decoded, mut i) = (text.as_bytes(), Vec::with_capacity(text.len()), 0);
    while i < bytes.len() {
        let escaped =
            text.get(i + 1..i + 3).filter(|_| bytes[i] == b'%').and_then(|hex| u8::from_str_radix(hex, 16).ok());
        decoded.push(escaped.unwrap_or(if bytes[i] == b'+' { b' ' } else { bytes[i] }));
        i += if escaped.is_some() { 3 } else { 1 };
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

#[cfg(test)]
#[path = "discovery_tests.rs"]
mod tests;
