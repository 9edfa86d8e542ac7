//! The configuration schema of proxyfleet-proxy, shared with the operator.

mod acme_challenges;
mod admin_report;
mod duration;
mod field;
mod grpc_transcoding;
mod http3;
mod http_rules;
mod live_weights;
pub mod metric_names;
mod path_rules;
mod proxy_config;
mod route_auth;
mod tcp_proxy;
mod traffic_split;
mod validate;
mod validate_auth;
mod validate_http;
mod validate_split;
mod validate_tcp;

pub use acme_challenges::{
    is_valid_token as is_valid_acme_token, AcmeChallenges, ACME_CHALLENGES_PATH, ACME_CHALLENGE_PREFIX,
};
pub use admin_report::{AdminReport, LoadedCertificate, ADMIN_REPORT_PATH};
pub use duration::{DurationParseError, HumanDuration, DURATION_PATTERN, MAX_SECS as MAX_DURATION_SECS};
pub use field::FieldError;
pub use grpc_transcoding::{GrpcTranscoding, DESCRIPTOR_SET_KEY};
pub use http3::{Http3, HTTP3_DEFAULT_IDLE_TIMEOUT};
pub use http_rules::{
    AccessLog, Cidr, Forwarding, HeaderOps, HeaderRules, HeaderValueRule, HttpsRedirect, Rewrite, TraceSettings,
};
pub use live_weights::{LiveWeights, LIVE_WEIGHTS_PATH};
pub use path_rules::{EscapedSlashes, PathRules};
pub use proxy_config::*;
pub use route_auth::{ClaimHeader, Cors, JwtAlgorithm, JwtAuth};
pub use tcp_proxy::{SniRoute, Socks5Auth, TcpMode, TcpProxy, SOCKS5_PASSWORD_FILE, SOCKS5_USERNAME_FILE};
pub use traffic_split::{bucket_of, Backend, BackendOverride, CookieMatch, Mirror, StickyKey, BUCKETS};
pub use validate::{is_valid_server_name, validate};
pub use validate_split::check_live_weights;

/// Why a configuration document was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration is not valid YAML for the schema: {0}")]
    Parse(String),
    #[error("configuration refused:\n  {}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n  "))]
    Invalid(Vec<FieldError>),
}

impl ProxyConfig {
    /// Parses and validates a YAML (or JSON) document. Errors name the offending field.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let de = serde_yaml::Deserializer::from_str(text);
        let config: ProxyConfig = serde_path_to_error_free(de)?;
        validate(&config).map_err(ConfigError::Invalid)?;
        Ok(config)
    }

    /// The configuration as YAML, as the operator writes it into a ConfigMap.
    pub fn to_yaml(&self) -> String {
        // Serialising plain data structs to YAML cannot fail.
        serde_yaml::to_string(self).unwrap_or_default()
    }
}

/// serde_yaml's messages already carry the path ("listeners[0].tls: unknown field `foo`").
fn serde_path_to_error_free(de: serde_yaml::Deserializer<'_>) -> Result<ProxyConfig, ConfigError> {
    serde::Deserialize::deserialize(de).map_err(|e: serde_yaml::Error| ConfigError::Parse(e.to_string()))
}

#[cfg(test)]
mod tests;
