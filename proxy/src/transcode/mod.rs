//! REST/JSON ↔ gRPC transcoding on a route (`grpcTranscoding`): an HTTP/JSON request that
//! matches a method's `google.api.http` rule becomes a gRPC call to the route's upstream, and
//! the answer comes back as JSON (server streams as one JSON object per line).
//!
//! Reading order: `bind` (rules from the descriptor set) → `template` (path templates) →
//! `message` (JSON ↔ protobuf) → `call` (the request and response on the wire) → `status`.

mod bind;
mod call;
pub mod message;
mod status;
pub mod template;

use std::sync::Arc;

use proxyfleet_config::GrpcTranscoding;

pub use bind::{bindings, BindError, Binding, BodyTarget};
pub use call::Call;
use message::JsonOptions;

#[derive(Debug, thiserror::Error)]
pub enum TranscodeLoadError {
    #[error("reading the descriptor set {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("descriptor set {path}: {source}")]
    Bind { path: String, source: BindError },
}

/// A path's variables: (field path, value).
pub type Variables = Vec<(String, String)>;

/// A route's transcoding: its bindings, in the order of the descriptor set.
pub struct Transcoder {
    bindings: Vec<Arc<Binding>>,
    options: JsonOptions,
    route: Arc<str>,
    metrics: crate::metrics::TranscodeFamily,
    /// `maxRequestBodyBytes`, defaulted.
    max_body: u64,
}

impl Transcoder {
    pub fn load(
        route: &str,
        config: &GrpcTranscoding,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Self, TranscodeLoadError> {
        let path = config.descriptor_set_file.clone().unwrap_or_default();
        let bytes = std::fs::read(&path).map_err(|source| TranscodeLoadError::Read {
            path: path.clone(),
            source,
        })?;
        let mut bound =
            bindings(&bytes, &config.services).map_err(|source| TranscodeLoadError::Bind { path, source })?;
        // `/v1/{name}:watch` before `/v1/{name}`: a path ending in a verb goes to the method
        // bound with that verb, not into the last variable (grpc-gateway's precedence).
        bound.sort_by_key(|b| !b.template.has_verb());
        if bound.is_empty() {
            tracing::warn!(
                route,
                "grpcTranscoding: no method of the descriptor set has a google.api.http rule"
            );
        }
        Ok(Self {
            bindings: bound.into_iter().map(Arc::new).collect(),
            options: JsonOptions {
                use_proto_field_names: config.use_proto_field_names,
                emit_defaults: config.emit_defaults,
            },
            route: route.into(),
            metrics: metrics.transcoded.clone(),
            max_body: config.max_request_body_bytes(),
        })
    }

    /// The first binding for this method and path, with the path's variables.
    pub fn find(&self, method: &http::Method, path: &str) -> Option<(&Arc<Binding>, Variables)> {
        self.bindings
            .iter()
            .filter(|b| b.verb == *method)
            .find_map(|b| b.template.matches(path).map(|vars| (b, vars)))
    }
}
