//! Kafka Connect's data model as far as the outbox event router uses it, and its converters:
//! [`Schema`] and [`Data`] (Connect's `Schema` and values), [`json_converter`] (Kafka's
//! `org.apache.kafka.connect.json.JsonConverter#fromConnectData`, with or without the
//! `{"schema":…,"payload":…}` envelope) and [`expand`] (Debezium's
//! `io.debezium.transforms.outbox.JsonSchemaData`: a JSON payload string expanded into a struct
//! with `table.expand.json.payload=true`). Sources: Kafka 4.x `connect-json` `JsonConverter`
//! (`asJsonSchema`, `convertToJson`), Debezium 3.x `EventRouterDelegate` and `JsonSchemaData`.

use crate::debezium::json::{self, Node};

/// A Connect schema type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// `boolean`.
    Boolean,
    /// `int16`.
    Int16,
    /// `int32`.
    Int32,
    /// `int64`.
    Int64,
    /// `double`.
    Float64,
    /// `string`.
    String,
    /// `bytes`.
    Bytes,
    /// `array`.
    Array,
    /// `struct`.
    Struct,
}

impl Type {
    /// The name JsonConverter writes in `"type"`.
    fn json_name(self) -> &'static str {
        match self {
            Type::Boolean => "boolean",
            Type::Int16 => "int16",
            Type::Int32 => "int32",
            Type::Int64 => "int64",
            Type::Float64 => "double",
            Type::String => "string",
            Type::Bytes => "bytes",
            Type::Array => "array",
            Type::Struct => "struct",
        }
    }
}

/// A Connect schema: type, optional, logical name and version, struct fields or array items.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    /// The type.
    pub ty: Type,
    /// Whether null is allowed.
    pub optional: bool,
    /// The logical or struct name (`io.debezium.data.Json`, `payload.items`).
    pub name: Option<String>,
    /// The schema version (`1` for `io.debezium.data.Json`).
    pub version: Option<i32>,
    /// A struct's fields, in order.
    pub fields: Vec<(String, Schema)>,
    /// An array's item schema.
    pub items: Option<Box<Schema>>,
}

impl Schema {
    /// A primitive schema.
    pub fn primitive(ty: Type, optional: bool) -> Self {
        Self {
            ty,
            optional,
            name: None,
            version: None,
            fields: Vec::new(),
            items: None,
        }
    }

    /// A string column holding MySQL JSON: Debezium's `io.debezium.data.Json` (version 1).
    pub fn json_string(optional: bool) -> Self {
        Self {
            name: Some("io.debezium.data.Json".into()),
            version: Some(1),
            ..Self::primitive(Type::String, optional)
        }
    }

    /// A struct schema.
    pub fn structure(name: Option<String>, optional: bool, fields: Vec<(String, Schema)>) -> Self {
        Self {
            name,
            fields,
            ..Self::primitive(Type::Struct, optional)
        }
    }

    /// JsonConverter's JSON form of the schema (`asJsonSchema`): `type`, then `items` or
    /// `fields` (each field's schema with `"field"` last), `optional`, `name`, `version`.
    pub fn to_json(&self) -> Node {
        let mut members: Vec<(String, Node)> =
            vec![("type".into(), Node::String(self.ty.json_name().into()))];
        match self.ty {
            Type::Array => {
                let items = self.items.as_deref().map_or(Node::Null, Schema::to_json);
                members.push(("items".into(), items));
            }
            Type::Struct => {
                let fields = self
                    .fields
                    .iter()
                    .map(|(name, schema)| {
                        let mut field = schema.to_json();
                        if let Node::Object(m) = &mut field {
                            m.push(("field".into(), Node::String(name.clone())));
                        }
                        field
                    })
                    .collect();
                members.push(("fields".into(), Node::Array(fields)));
            }
            _ => {}
        }
        members.push(("optional".into(), Node::Bool(self.optional)));
        if let Some(name) = &self.name {
            members.push(("name".into(), Node::String(name.clone())));
        }
        if let Some(v) = self.version {
            members.push(("version".into(), Node::Int(v)));
        }
        Node::Object(members)
    }
}

/// A Connect value.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// null.
    Null,
    /// A boolean.
    Bool(bool),
    /// An `int16`/`int32`/`int64` value.
    Int(i64),
    /// A `double`.
    Float64(f64),
    /// A string.
    Str(String),
    /// An array.
    Array(Vec<Data>),
    /// A struct's values, in its schema's field order (`Null` for a field not set).
    Struct(Vec<Data>),
}

/// JsonConverter's JSON of `value` under `schema` (`convertToJson`).
pub fn to_json(schema: &Schema, value: &Data) -> Node {
    match value {
        Data::Null => Node::Null,
        Data::Bool(b) => Node::Bool(*b),
        Data::Int(v) => match i32::try_from(*v) {
            Ok(v) if schema.ty != Type::Int64 => Node::Int(v),
            _ => Node::Long(*v),
        },
        Data::Float64(d) => Node::Double(*d),
        Data::Str(s) => Node::String(s.clone()),
        Data::Array(items) => {
            let item_schema = schema
                .items
                .as_deref()
                .cloned()
                .unwrap_or_else(|| Schema::primitive(Type::String, true));
            Node::Array(items.iter().map(|i| to_json(&item_schema, i)).collect())
        }
        Data::Struct(values) => Node::Object(
            schema
                .fields
                .iter()
                .zip(values.iter().chain(std::iter::repeat(&Data::Null)))
                .map(|((name, s), v)| (name.clone(), to_json(s, v)))
                .collect(),
        ),
    }
}

/// `JsonConverter.fromConnectData(topic, schema, value)` with `schemas.enable` =
/// `with_schema`: the JSON bytes, `None` for a null value without schema (a tombstone).
pub fn json_converter(schema: &Schema, value: &Data, with_schema: bool) -> Vec<u8> {
    let payload = to_json(schema, value);
    let node = if with_schema {
        Node::Object(vec![
            ("schema".into(), schema.to_json()),
            ("payload".into(), payload),
        ])
    } else {
        payload
    };
    let mut out = Vec::new();
    json::write_jackson(&node, &mut out);
    out
}

/// `value.toString()` in Java, what `StringConverter` writes for a value: a string as it is,
/// numbers and booleans as Java prints them, a list as `[a, b]`, a struct as Connect's
/// `Struct.toString()` (`Struct{name=value,…}`, null fields left out).
pub fn java_to_string(value: &Data) -> String {
    match value {
        Data::Null => "null".into(),
        Data::Bool(b) => b.to_string(),
        Data::Int(v) => v.to_string(),
        Data::Float64(d) => crate::debezium::java::double_to_string(*d),
        Data::Str(s) => s.clone(),
        Data::Array(items) => format!(
            "[{}]",
            items
                .iter()
                .map(java_to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Data::Struct(_) => "Struct{}".into(),
    }
}

/// `Struct.toString()` of `value` under `schema`: `Struct{` + the non-null fields as
/// `name=value`, comma-separated + `}` (Kafka Connect `org.apache.kafka.connect.data.Struct`).
pub fn struct_to_string(schema: &Schema, value: &Data) -> String {
    let Data::Struct(values) = value else {
        return java_to_string(value);
    };
    let mut out = String::from("Struct{");
    let mut first = true;
    for ((name, s), v) in schema.fields.iter().zip(values) {
        if matches!(v, Data::Null) {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(name);
        out.push('=');
        match v {
            Data::Struct(_) => out.push_str(&struct_to_string(s, v)),
            Data::Array(items) => {
                let item_schema = s.items.as_deref();
                let parts: Vec<String> = items
                    .iter()
                    .map(|i| match (i, item_schema) {
                        (Data::Struct(_), Some(is)) => struct_to_string(is, i),
                        _ => java_to_string(i),
                    })
                    .collect();
                out.push('[');
                out.push_str(&parts.join(", "));
                out.push(']');
            }
            other => out.push_str(&java_to_string(other)),
        }
    }
    out.push('}');
    out
}

/// `JsonConverter.fromConnectData(topic, null, value)` for a string value without schema
/// (after a payload expansion that left no schema): the JSON string, or with schemas
/// `{"schema":null,"payload":"…"}`.
pub fn json_converter_without_schema(value: &str, with_schema: bool) -> Vec<u8> {
    let payload = Node::String(value.to_owned());
    let node = if with_schema {
        Node::Object(vec![
            ("schema".into(), Node::Null),
            ("payload".into(), payload),
        ])
    } else {
        payload
    };
    let mut out = Vec::new();
    json::write_jackson(&node, &mut out);
    out
}

/// What JSON `null` members become in an expanded payload
/// (`table.json.payload.null.behavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NullBehavior {
    /// `ignore` (Debezium's default): left out of the schema, so out of the value.
    #[default]
    Ignore,
    /// `optional_bytes`: an optional `bytes` field holding null.
    OptionalBytes,
}

/// Why a payload cannot be expanded (Debezium then logs "JSON expansion failed").
pub type ExpandError = String;

/// A payload that does not expand: why, and whether Debezium had already replaced the
/// payload's schema by none (an empty top-level array has no schema: Debezium then sends the
/// string with no schema, `{"schema":null,"payload":"[]"}` under JsonConverter with schemas).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpandFailure {
    /// Why.
    pub reason: ExpandError,
    /// The payload's schema became null before the failure.
    pub schema_dropped: bool,
}

impl From<ExpandError> for ExpandFailure {
    fn from(reason: ExpandError) -> Self {
        Self {
            reason,
            schema_dropped: false,
        }
    }
}

/// Debezium's expansion of a JSON payload string (`table.expand.json.payload=true`): the
/// struct schema named `field` (the payload column's name) and its value. Only an object
/// expands into a value; Debezium parses text starting with `{` or `[` only.
///
/// # Errors
/// Text that is not a JSON object or array, an array whose elements differ in type (or in
/// number type), an array of nulls or empty arrays, a top-level array, or a value that does
/// not fit the schema built from the document (an integer beyond `long`). Debezium's own
/// expansion fails on these too: it then keeps the payload string (for schema-building
/// failures) or stops with a DataException (for value failures); the relay keeps the string.
pub fn expand(
    field: &str,
    payload: &str,
    nulls: NullBehavior,
) -> Result<(Schema, Data), ExpandFailure> {
    if !(payload.starts_with('{') || payload.starts_with('[')) {
        let first = payload.chars().next().map(String::from).unwrap_or_default();
        return Err(format!("Unable to parse payload starting with '{first}'").into());
    }
    let node = json::parse(payload)?;
    let expander = Expander { nulls };
    let Some(schema) = expander.schema(Some(field), &node)? else {
        return Err(ExpandFailure {
            reason: "the payload has no schema (an empty array)".into(),
            schema_dropped: true,
        });
    };
    if schema.ty != Type::Struct {
        return Err(ExpandError::from(
            "Not a struct schema: a top-level array cannot expand into a struct",
        )
        .into());
    }
    let value = struct_value(&node, &schema)?;
    Ok((schema, value))
}

struct Expander {
    nulls: NullBehavior,
}

impl Expander {
    /// `toConnectSchema(key, node)`; `None` for what has no schema (null, an empty array).
    fn schema(&self, key: Option<&str>, node: &Node) -> Result<Option<Schema>, ExpandError> {
        Ok(match node {
            Node::String(_) => Some(Schema::primitive(Type::String, true)),
            Node::Bool(_) => Some(Schema::primitive(Type::Boolean, true)),
            Node::Int(_) => Some(Schema::primitive(Type::Int32, true)),
            Node::Long(_) => Some(Schema::primitive(Type::Int64, true)),
            Node::BigInt(_) | Node::Double(_) => Some(Schema::primitive(Type::Float64, true)),
            Node::Array(items) if items.is_empty() => None,
            Node::Array(items) => Some(Schema {
                items: Some(Box::new(self.array_item_schema(key, items)?)),
                ..Schema::primitive(Type::Array, true)
            }),
            Node::Object(members) => {
                let mut fields: Vec<(String, Schema)> = Vec::new();
                for (name, value) in members {
                    let field_key = match key {
                        Some(k) if !k.trim().is_empty() => format!("{k}.{name}"),
                        _ => name.clone(),
                    };
                    if let Some(s) = self.schema(Some(&field_key), value)? {
                        if !fields.iter().any(|(n, _)| n == name) {
                            fields.push((name.clone(), s));
                        }
                    }
                }
                Some(Schema::structure(key.map(str::to_owned), true, fields))
            }
            Node::Null => match self.nulls {
                NullBehavior::OptionalBytes => Some(Schema::primitive(Type::Bytes, true)),
                NullBehavior::Ignore => None,
            },
        })
    }

    /// `toConnectSchemaWithCycles`: the schema of an array's elements.
    fn array_item_schema(&self, key: Option<&str>, items: &[Node]) -> Result<Schema, ExpandError> {
        let sample = first_element(items)?;
        if let Node::Object(_) = sample {
            // Debezium merges the object elements' schemas from a HashSet, whose order varies
            // between JVM runs when they differ; first appearance is what the relay uses.
            let mut merged: Option<Schema> = None;
            let mut seen: Vec<Schema> = Vec::new();
            for item in items {
                if !matches!(item, Node::Object(_)) {
                    continue;
                }
                let Some(s) = self.schema(key, item)? else {
                    continue;
                };
                if seen.contains(&s) {
                    continue;
                }
                seen.push(s.clone());
                merged = Some(match merged {
                    None => s,
                    Some(left) => merge(left, s),
                });
            }
            merged.ok_or_else(|| "Array has unrecognized member schema.".to_string())
        } else {
            self.schema(None, sample)?
                .ok_or_else(|| "Array has unrecognized member schema.".to_string())
        }
    }
}

/// `getFirstArrayElement`: the first non-null element; every element of one JSON type (and one
/// number schema).
fn first_element(items: &[Node]) -> Result<&Node, ExpandError> {
    let kind = |n: &Node| match n {
        Node::Null => 0,
        Node::Bool(_) => 1,
        Node::Int(_) | Node::Long(_) | Node::BigInt(_) | Node::Double(_) => 2,
        Node::String(_) => 3,
        Node::Array(_) => 4,
        Node::Object(_) => 5,
    };
    let number_type = |n: &Node| match n {
        Node::Int(_) => 0,
        Node::Long(_) => 1,
        _ => 2,
    };
    let mut sample: Option<&Node> = None;
    for item in items {
        if matches!(item, Node::Null) {
            continue;
        }
        let Some(first) = sample else {
            sample = Some(item);
            continue;
        };
        if kind(first) != kind(item) {
            return Err("Field is not a homogenous array".into());
        }
        if kind(first) == 2 && number_type(first) != number_type(item) {
            return Err("Field is not a homogenous array, different number types".into());
        }
    }
    Ok(sample.unwrap_or(&Node::Null))
}

/// `mergeSchema`: `left`'s fields, then `right`'s new ones (a `bytes` field of `left` gives way
/// to `right`'s other type).
fn merge(left: Schema, right: Schema) -> Schema {
    // `SchemaUtil.copySchemaBasics` copies name, version, doc and parameters, not
    // `optional`: the merged schema is required.
    let mut fields = left.fields.clone();
    for (name, s) in right.fields {
        match fields.iter_mut().find(|(n, _)| *n == name) {
            None => fields.push((name, s)),
            Some(slot) => {
                if slot.1 != s && slot.1.ty == Type::Bytes && s.ty != Type::Bytes {
                    slot.1 = s;
                }
            }
        }
    }
    Schema {
        fields,
        optional: false,
        ..left
    }
}

/// `jsonNodeToStructInternal`: the struct of `node` (an object) under `schema`.
fn struct_value(node: &Node, schema: &Schema) -> Result<Data, ExpandError> {
    let Node::Object(members) = node else {
        return Err("Not a struct schema".into());
    };
    let mut values = Vec::with_capacity(schema.fields.len());
    for (name, s) in &schema.fields {
        values.push(match members.iter().find(|(n, _)| n == name) {
            Some((_, v)) => field_value(v, s)?,
            None => Data::Null,
        });
    }
    Ok(Data::Struct(values))
}

/// `getStructFieldValue`, with the check Connect's `Struct.put` makes (the value's Java type
/// against the schema's).
fn field_value(node: &Node, schema: &Schema) -> Result<Data, ExpandError> {
    let mismatch = || {
        Err(format!(
            "Invalid Java object for schema type {}",
            schema.ty.json_name()
        ))
    };
    Ok(match node {
        // Connect's `Struct.put` refuses null for a required schema (a merged array item).
        Node::Null if !schema.optional => {
            return Err("Conversion error: null value for field that is required".into())
        }
        Node::Null => Data::Null,
        Node::String(s) if schema.ty == Type::String => Data::Str(s.clone()),
        Node::Bool(b) if schema.ty == Type::Boolean => Data::Bool(*b),
        Node::Double(d) if schema.ty == Type::Float64 => Data::Float64(*d),
        Node::Int(v) if schema.ty == Type::Int32 => Data::Int(i64::from(*v)),
        Node::Long(v) if schema.ty == Type::Int64 => Data::Int(*v),
        Node::Array(items) if schema.ty == Type::Array => {
            let item_schema = schema
                .items
                .as_deref()
                .ok_or_else(|| "array schema without items".to_string())?;
            Data::Array(
                items
                    .iter()
                    .map(|i| field_value(i, item_schema))
                    .collect::<Result<_, _>>()?,
            )
        }
        Node::Object(_) if schema.ty == Type::Struct => struct_value(node, schema)?,
        _ => return mismatch(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(bytes: Vec<u8>) -> String {
        String::from_utf8(bytes).expect("valid")
    }

    #[test]
    fn string_schemas_and_envelopes() {
        let key = Schema::primitive(Type::String, false);
        assert_eq!(
            text(json_converter(&key, &Data::Str("order-1".into()), true)),
            r#"{"schema":{"type":"string","optional":false},"payload":"order-1"}"#
        );
        assert_eq!(
            text(json_converter(&key, &Data::Str("order-1".into()), false)),
            r#""order-1""#
        );
        let payload = Schema::json_string(true);
        assert_eq!(
            text(json_converter(&payload, &Data::Null, true)),
            r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":null}"#
        );
        assert_eq!(text(json_converter(&payload, &Data::Null, false)), "null");
    }

    #[test]
    fn expansion_builds_named_optional_structs_without_null_members() {
        let (schema, value) = expand(
            "payload",
            r#"{"a":1,"b":null,"c":{"d":"x","e":[1,2]},"f":[],"g":1.5,"h":4000000000}"#,
            NullBehavior::Ignore,
        )
        .expect("valid");
        assert_eq!(
            text(json_converter(&schema, &value, false)),
            r#"{"a":1,"c":{"d":"x","e":[1,2]},"g":1.5,"h":4000000000}"#
        );
        assert_eq!(
            text(json_converter(&schema, &value, true)),
            concat!(
                r#"{"schema":{"type":"struct","fields":["#,
                r#"{"type":"int32","optional":true,"field":"a"},"#,
                r#"{"type":"struct","fields":[{"type":"string","optional":true,"field":"d"},"#,
                r#"{"type":"array","items":{"type":"int32","optional":true},"optional":true,"field":"e"}],"#,
                r#""optional":true,"name":"payload.c","field":"c"},"#,
                r#"{"type":"double","optional":true,"field":"g"},"#,
                r#"{"type":"int64","optional":true,"field":"h"}],"#,
                r#""optional":true,"name":"payload"},"#,
                r#""payload":{"a":1,"c":{"d":"x","e":[1,2]},"g":1.5,"h":4000000000}}"#
            )
        );
    }

    #[test]
    fn arrays_of_objects_merge_their_fields_and_fill_nulls() {
        let (schema, value) = expand(
            "payload",
            r#"{"items":[{"sku":"a","qty":1},{"sku":"b","note":"n"}]}"#,
            NullBehavior::Ignore,
        )
        .expect("valid");
        assert_eq!(
            text(json_converter(&schema, &value, false)),
            r#"{"items":[{"sku":"a","qty":1,"note":null},{"sku":"b","qty":null,"note":"n"}]}"#
        );
    }

    #[test]
    fn what_debezium_cannot_expand_is_refused() {
        for bad in [
            "42",
            "\"s\"",
            "[1,2]",
            r#"{"a":[1,"x"]}"#,
            r#"{"a":[1,4000000000]}"#,
            r#"{"a":[null]}"#,
            r#"{"a":18446744073709551615}"#,
        ] {
            assert!(
                expand("payload", bad, NullBehavior::Ignore).is_err(),
                "{bad}"
            );
        }
        let (schema, value) = expand("payload", "{}", NullBehavior::Ignore).expect("valid");
        assert_eq!(text(json_converter(&schema, &value, false)), "{}");
    }

    #[test]
    fn merged_object_items_are_required() {
        let (schema, _) = expand(
            "payload",
            r#"{"items":[{"a":1},{"b":2}]}"#,
            NullBehavior::Ignore,
        )
        .expect("valid");
        let items = schema.fields[0].1.items.as_deref().expect("items");
        assert!(!items.optional);
        assert!(expand(
            "payload",
            r#"{"items":[{"a":1},{"b":2},null]}"#,
            NullBehavior::Ignore
        )
        .is_err());
        // One shape: no merge, the element schema stays optional.
        let (schema, _) = expand(
            "payload",
            r#"{"items":[{"a":1},{"a":2},null]}"#,
            NullBehavior::Ignore,
        )
        .expect("valid");
        assert!(schema.fields[0].1.items.as_deref().expect("items").optional);
    }

    #[test]
    fn string_converter_prints_structs_as_java_does() {
        let (schema, value) = expand(
            "payload",
            r#"{"a":1,"b":null,"c":{"d":"x","e":[1,2]},"g":1.5,"h":[{"i":true}]}"#,
            NullBehavior::Ignore,
        )
        .expect("valid");
        assert_eq!(
            struct_to_string(&schema, &value),
            "Struct{a=1,c=Struct{d=x,e=[1, 2]},g=1.5,h=[Struct{i=true}]}"
        );
    }

    #[test]
    fn optional_bytes_keeps_null_members() {
        let (schema, value) = expand(
            "payload",
            r#"{"a":null,"b":1}"#,
            NullBehavior::OptionalBytes,
        )
        .expect("valid");
        assert_eq!(
            text(json_converter(&schema, &value, false)),
            r#"{"a":null,"b":1}"#
        );
    }
}
