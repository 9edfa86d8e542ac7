//! REST/JSON ↔ gRPC transcoding on a route (the grpc-gateway design): HTTP/JSON requests are
//! mapped to gRPC calls by the methods' `google.api.http` annotations in a protobuf
//! descriptor set.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::field::{err, FieldError};

/// The key of a descriptor-set ConfigMap (`binaryData`) that holds the descriptor set.
pub const DESCRIPTOR_SET_KEY: &str = "descriptors.pb";

/// Serve the route's gRPC methods as HTTP/JSON too, by their `google.api.http` rules. gRPC
/// requests (`content-type: application/grpc`) still pass through unchanged.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.descriptorSetFile)",
    "message": "descriptorSetFile is for the standalone proxy; in a ProxyDeployment name descriptorSetConfigMap"
}, {
    "rule": "has(self.descriptorSetConfigMap) != has(self.descriptorSetSecret)",
    "message": "give exactly one of descriptorSetConfigMap or descriptorSetSecret (holding descriptors.pb)"
}]))]
pub struct GrpcTranscoding {
    /// A binary `FileDescriptorSet` (`protoc --include_imports --descriptor_set_out`), on disk
    /// (standalone proxy); re-read when it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub descriptor_set_file: Option<String>,
    /// In a ProxyDeployment: a ConfigMap of the fleet's namespace whose `binaryData`
    /// `descriptors.pb` holds the descriptor set, mounted into the pods and hot-reloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub descriptor_set_config_map: Option<String>,
    /// In a ProxyDeployment: a Secret of the fleet's namespace whose `descriptors.pb` holds the
    /// descriptor set (for APIs whose schema is not public), mounted and hot-reloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub descriptor_set_secret: Option<String>,
    /// Only these services (full names, `pkg.Service`); every service of the set when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 512)))]
    pub services: Vec<String>,
    /// Responses name fields as in the .proto (`user_id`) instead of lowerCamelCase JSON names.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub use_proto_field_names: bool,
    /// Responses include fields that hold their default value (proto3 JSON `EmitUnpopulated`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub emit_defaults: bool,
    /// The largest JSON body transcoded (bytes; also bounded by `limits.maxRequestBodyBytes`).
    /// A decoded message can take tens of times its JSON's size (`[0,0,…]` as a repeated
    /// field: about 25 ×), so the default is smaller than other bodies': 1048576 (1 MiB, the
    /// buffer Envoy's transcoder gets by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 16777216))]
    pub max_request_body_bytes: Option<u32>,
}

/// `maxRequestBodyBytes`' default.
pub const TRANSCODED_BODY_DEFAULT: u32 = 1 << 20;

impl GrpcTranscoding {
    /// `maxRequestBodyBytes`, defaulted.
    pub fn max_request_body_bytes(&self) -> u64 {
        u64::from(self.max_request_body_bytes.unwrap_or(TRANSCODED_BODY_DEFAULT))
    }
}

/// Checks a route's `grpcTranscoding`; `f` names the route.
pub(crate) fn check_route(f: &str, r: &crate::Route, config: &crate::ProxyConfig, errors: &mut Vec<FieldError>) {
    let Some(t) = &r.grpc_transcoding else { return };
    let f = format!("{f}.grpcTranscoding");
    check_transcoding(&f, t, errors);
    let used = |name: &str| r.upstream == name || r.backends.iter().any(|b| b.upstream == name);
    for u in config.upstreams.iter().filter(|u| used(&u.name)) {
        if u.protocol == crate::UpstreamProtocol::Http1 {
            errors.push(err(
                f.clone(),
                format!(
                    "upstream {} speaks HTTP/1.1; gRPC needs protocol h2 (or auto over TLS)",
                    u.name
                ),
            ));
        }
    }
}

fn check_transcoding(f: &str, t: &GrpcTranscoding, errors: &mut Vec<FieldError>) {
    let in_cluster = t.descriptor_set_config_map.is_some() || t.descriptor_set_secret.is_some();
    match &t.descriptor_set_file {
        None if !in_cluster => errors.push(err(
            f,
            "name descriptorSetFile (standalone), descriptorSetConfigMap or descriptorSetSecret",
        )),
        Some(p) if p.is_empty() => errors.push(err(format!("{f}.descriptorSetFile"), "must not be empty")),
        _ => {}
    }
    for (i, s) in t.services.iter().enumerate() {
        let valid = !s.is_empty()
            && s.split('.')
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if !valid {
            errors.push(err(
                format!("{f}.services[{i}]"),
                format!("{s:?} is not a full service name (pkg.Service)"),
            ));
        }
    }
}
