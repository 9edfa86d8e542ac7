//! The JSON → protobuf half of REST↔gRPC transcoding (issue 19), over the bindings of the test
//! descriptor set (grpc.health.v1 with HTTP rules): any path, query and body give a gRPC
//! request message or a RequestError, never a panic; a message that is made survives a
//! protobuf round trip and a JSON round trip unchanged (compared on the wire: a proto3 field
//! set to its default is the same message as one left unset).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use prost_reflect::DynamicMessage;
use proxyfleet_proxy::transcode::message::{json_to_message, message_json, request_message, JsonOptions};
use proxyfleet_proxy::transcode::{bindings, Binding};

fn all() -> &'static [Binding] {
    static B: OnceLock<Vec<Binding>> = OnceLock::new();
    B.get_or_init(|| bindings(include_bytes!("../../tests/data/health_http.pb"), &[]).expect("the test descriptor set"))
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let b = &all()[usize::from(pick) % all().len()];
    // PATH \n QUERY \n BODY
    let mut parts = rest.splitn(3, |&c| c == b'\n');
    let path = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let query = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let body = parts.next().unwrap_or_default();
    let vars = b.template.matches(&path).unwrap_or_default();
    let Ok(msg) = request_message(b, body, &vars, Some(&query)) else { return };
    let wire = msg.encode_to_vec();
    let back = DynamicMessage::decode(b.method.input(), wire.as_slice()).expect("our own encoding decodes");
    assert_eq!(back.encode_to_vec(), wire);
    let json = message_json(&msg, JsonOptions::default()).expect("a message serializes");
    let again = json_to_message(b.method.input(), json.to_string().as_bytes()).expect("our own JSON parses");
    assert_eq!(again.encode_to_vec(), wire, "{json}");
});
