//! The JSON ↔ protobuf halves of transcoding, without I/O: the request message from the body,
//! path variables and query parameters; the response message as JSON; gRPC's length-prefixed
//! framing.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message as _;
use prost_reflect::{
    DeserializeOptions, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, ReflectMessage, SerializeOptions,
    Value,
};

use super::bind::{Binding, BodyTarget};

/// How responses are written as JSON (`grpcTranscoding` options).
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonOptions {
    pub use_proto_field_names: bool,
    pub emit_defaults: bool,
}

/// Why a request could not become a gRPC message: the client's fault (400).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RequestError {
    #[error("the body is not JSON for {message}: {why}")]
    Body { message: String, why: String },
    #[error("{name}: {why}")]
    Field { name: String, why: String },
}

/// JSON → message of type `desc` (canonical proto3 JSON; unknown fields refused).
pub fn json_to_message(desc: MessageDescriptor, json: &[u8]) -> Result<DynamicMessage, RequestError> {
    let fail = |why: String| RequestError::Body {
        message: desc.full_name().to_string(),
        why,
    };
    let mut de = serde_json::Deserializer::from_slice(json);
    let msg = DynamicMessage::deserialize_with_options(desc.clone(), &mut de, &DeserializeOptions::new())
        .map_err(|e| fail(e.to_string()))?;
    de.end().map_err(|e| fail(e.to_string()))?;
    Ok(msg)
}

/// The gRPC request message of a bound HTTP request.
pub fn request_message(
    b: &Binding,
    body: &[u8],
    vars: &[(String, String)],
    query: Option<&str>,
) -> Result<DynamicMessage, RequestError> {
    let input = b.method.input();
    let blank = body.iter().all(u8::is_ascii_whitespace);
    let mut msg = match &b.body {
        BodyTarget::Whole if !blank => json_to_message(input, body)?,
        BodyTarget::Field(f) if !blank => {
            // `{"field": <body>}`: the field's own JSON mapping, whatever its type.
            let mut wrapped = Vec::with_capacity(body.len() + f.len() + 6);
            wrapped.extend_from_slice(b"{\"");
            wrapped.extend_from_slice(f.as_bytes());
            wrapped.extend_from_slice(b"\":");
            wrapped.extend_from_slice(body);
            wrapped.push(b'}');
            json_to_message(input, &wrapped)?
        }
        _ => DynamicMessage::new(input),
    };
    for (field, value) in vars {
        set_path(&mut msg, field, value)?;
    }
    if b.body != BodyTarget::Whole {
        for (name, value) in query_pairs(query.unwrap_or("")) {
            let bound = vars.iter().any(|(f, _)| *f == name)
                || matches!(&b.body, BodyTarget::Field(f) if name == *f || name.starts_with(&format!("{f}.")));
            if !bound {
                set_path(&mut msg, &name, &value)?;
            }
        }
    }
    Ok(msg)
}

/// `a=1&b=x+y` → decoded pairs; a pair that does not decode is skipped.
fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).filter_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| super::template::percent_decode(&s.replace('+', " "));
        Some((decode(k)?, decode(v)?))
    })
}

/// Sets the field at a dotted path (`a.b.c`) from its text form; a repeated field gains it.
pub fn set_path(root: &mut DynamicMessage, path: &str, raw: &str) -> Result<(), RequestError> {
    let fail = |why: &str| RequestError::Field {
        name: path.to_string(),
        why: why.to_string(),
    };
    let mut names = path.split('.').peekable();
    let mut cur = root;
    while let Some(name) = names.next() {
        let desc = cur.descriptor();
        let fd = desc
            .get_field_by_name(name)
            .or_else(|| desc.get_field_by_json_name(name))
            .ok_or_else(|| fail(&format!("no field {name} in {}", desc.full_name())))?;
        if names.peek().is_some() {
            if fd.is_list() || fd.is_map() {
                return Err(fail("a repeated field cannot be in the middle of a path"));
            }
            cur = cur
                .get_field_mut(&fd)
                .as_message_mut()
                .ok_or_else(|| fail("not a message"))?;
            continue;
        }
        if fd.is_map() {
            return Err(fail("a map field cannot be set from the path or query"));
        }
        let value = scalar(&fd, &desc, raw).map_err(|why| fail(&why))?;
        if fd.is_list() {
            if let Some(list) = cur.get_field_mut(&fd).as_list_mut() {
                list.push(value);
            }
        } else {
            cur.try_set_field(&fd, value).map_err(|e| fail(&e.to_string()))?;
        }
    }
    Ok(())
}

/// A field's value from text, as grpc-gateway reads path and query values.
fn scalar(fd: &FieldDescriptor, parent: &MessageDescriptor, s: &str) -> Result<Value, String> {
    let bad = |e: &dyn std::fmt::Display| format!("{s:?}: {e}");
    Ok(match fd.kind() {
        Kind::String => Value::String(s.to_string()),
        Kind::Bool => Value::Bool(match s {
            "true" | "1" => true,
            "false" | "0" => false,
            _ => return Err(bad(&"not a bool")),
        }),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(s.parse().map_err(|e| bad(&e))?),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(s.parse().map_err(|e| bad(&e))?),
        Kind::Uint32 | Kind::Fixed32 => Value::U32(s.parse().map_err(|e| bad(&e))?),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(s.parse().map_err(|e| bad(&e))?),
        Kind::Float => Value::F32(s.parse().map_err(|e| bad(&e))?),
        Kind::Double => Value::F64(s.parse().map_err(|e| bad(&e))?),
        Kind::Enum(e) => Value::EnumNumber(
            e.get_value_by_name(s)
                .map(|v| v.number())
                .or_else(|| s.parse().ok())
                .ok_or_else(|| bad(&format!("not a value of {}", e.full_name())))?,
        ),
        // Bytes (base64) and messages (Timestamp, Duration, wrappers, FieldMask) by their JSON
        // mapping, as a JSON string.
        Kind::Bytes | Kind::Message(_) => {
            let json = serde_json::json!({ fd.name(): s }).to_string();
            let mut holder = json_to_message(parent.clone(), json.as_bytes()).map_err(|e| bad(&e))?;
            let mut v = holder.take_field(fd).ok_or_else(|| bad(&"no value"))?;
            if let Value::List(items) = &mut v {
                v = items.pop().ok_or_else(|| bad(&"no value"))?;
            }
            v
        }
    })
}

/// A message as JSON.
pub fn message_json(msg: &DynamicMessage, opts: JsonOptions) -> Result<serde_json::Value, String> {
    let so = SerializeOptions::new()
        .use_proto_field_name(opts.use_proto_field_names)
        .skip_default_fields(!opts.emit_defaults);
    msg.serialize_with_options(serde_json::value::Serializer, &so)
        .map_err(|e| e.to_string())
}

/// A response message (protobuf bytes) as the JSON the client gets: the whole message, or its
/// `response_body` field.
pub fn response_json(b: &Binding, bytes: Bytes, opts: JsonOptions) -> Result<serde_json::Value, String> {
    let msg = DynamicMessage::decode(b.method.output(), bytes).map_err(|e| e.to_string())?;
    let mut json = message_json(&msg, opts)?;
    if let Some(field) = &b.response_body {
        let fd = msg
            .descriptor()
            .get_field_by_name(field)
            .ok_or("no response_body field")?;
        let key = if opts.use_proto_field_names {
            fd.name()
        } else {
            fd.json_name()
        };
        json = json
            .get_mut(key)
            .map(serde_json::Value::take)
            .unwrap_or(serde_json::Value::Null);
    }
    Ok(json)
}

/// One length-prefixed gRPC message (uncompressed).
pub fn frame(msg: &DynamicMessage) -> Bytes {
    let len = msg.encoded_len();
    let mut out = BytesMut::with_capacity(5 + len);
    out.put_u8(0);
    out.put_u32(len as u32);
    msg.encode_raw(&mut out);
    out.freeze()
}

/// Takes one whole message off the front of `buf`, when it holds one.
/// The largest message from the upstream the proxy turns into JSON, as gRPC's own default
/// receive limit: a message is held whole before it is decoded.
pub const MAX_MESSAGE: usize = 4 << 20;

/// Whether the message at the front of `buf` says it is larger than [`MAX_MESSAGE`] (known
/// from its 5-byte prefix, before any of it is held).
pub fn declared_too_large(buf: &[u8]) -> bool {
    buf.len() >= 5 && u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize > MAX_MESSAGE
}

pub fn unframe(buf: &mut BytesMut) -> Option<Result<Bytes, &'static str>> {
    if buf.len() < 5 {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() < 5 + len {
        return None;
    }
    let compressed = buf[0] != 0;
    buf.advance(5);
    let msg = buf.split_to(len).freeze();
    Some(if compressed {
        Err("a compressed message (none was offered)")
    } else {
        Ok(msg)
    })
}
