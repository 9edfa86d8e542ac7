//! HTTP/3 over QUIC beside a TLS listener: same port number over UDP, same certificates,
//! routes, upstreams, limits and metrics.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::field::{err, FieldError};
use crate::HumanDuration;

/// HTTP/3 (QUIC) on the listener's port over UDP; off when absent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Http3 {
    /// Advertise HTTP/3 with `Alt-Svc` on the TLS listener's responses. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<bool>,
    /// The UDP port clients reach, as advertised in `Alt-Svc`. Default: the listener's port
    /// (the operator sets the Service port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub advertised_port: Option<u16>,
    /// How long a client may remember the advertisement (`ma`). Default 24h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise_max_age: Option<HumanDuration>,
    /// Accept 0-RTT early data from resuming clients. Early data can be replayed by an
    /// attacker: only safe requests without a body (GET, HEAD, OPTIONS) are served from it,
    /// marked `Early-Data: 1` upstream (RFC 8470); others wait for the handshake. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub zero_rtt: bool,
    /// A connection with no traffic for this long is closed. Default 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<HumanDuration>,
    /// Concurrent request streams a client may open. Default 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_concurrent_streams: Option<u32>,
    /// Receive window per stream (bytes of a request body buffered before the client must
    /// wait). Default 1048576.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16384, max = 16777216))]
    pub stream_window_bytes: Option<u32>,
    /// Receive window per connection. Default 4194304.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16384, max = 67108864))]
    pub connection_window_bytes: Option<u32>,
}

pub const HTTP3_DEFAULT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
pub const HTTP3_DEFAULT_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(86_400);
const MAX_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

impl Http3 {
    pub fn advertises(&self) -> bool {
        self.advertise.unwrap_or(true)
    }

    pub fn idle_timeout(&self) -> std::time::Duration {
        self.idle_timeout
            .as_ref()
            .map_or(HTTP3_DEFAULT_IDLE_TIMEOUT, |d| d.get())
    }

    pub fn max_concurrent_streams(&self) -> u32 {
        self.max_concurrent_streams.unwrap_or(100)
    }

    pub fn stream_window_bytes(&self) -> u32 {
        self.stream_window_bytes.unwrap_or(1024 * 1024)
    }

    pub fn connection_window_bytes(&self) -> u32 {
        self.connection_window_bytes.unwrap_or(4 * 1024 * 1024)
    }

    /// The `Alt-Svc` value for a listener on `port`: `h3=":443"; ma=86400`.
    pub fn alt_svc(&self, port: u16) -> String {
        let max_age = self
            .advertise_max_age
            .as_ref()
            .map_or(HTTP3_DEFAULT_MAX_AGE, |d| d.get());
        format!(
            "h3=\":{}\"; ma={}",
            self.advertised_port.unwrap_or(port),
            max_age.as_secs()
        )
    }
}

/// Checks the schema cannot express; `f` names the `http3` field.
pub(crate) fn check_http3(f: &str, h: &Http3, errors: &mut Vec<FieldError>) {
    if let Some(d) = &h.idle_timeout {
        if d.get().is_zero() || d.get() > MAX_IDLE_TIMEOUT {
            errors.push(err(format!("{f}.idleTimeout"), "must be more than 0s and at most 10m"));
        }
    }
    if h.advertised_port == Some(0) {
        errors.push(err(format!("{f}.advertisedPort"), "must be 1-65535"));
    }
    if h.max_concurrent_streams == Some(0) {
        errors.push(err(format!("{f}.maxConcurrentStreams"), "must be at least 1"));
    }
    for (v, name) in [
        (h.stream_window_bytes, "streamWindowBytes"),
        (h.connection_window_bytes, "connectionWindowBytes"),
    ] {
        if v.is_some_and(|v| v < 16384) {
            errors.push(err(format!("{f}.{name}"), "must be at least 16384"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alt_svc_names_the_advertised_port_and_max_age() {
        let h = Http3::default();
        assert_eq!(h.alt_svc(8443), "h3=\":8443\"; ma=86400");
        let h: Http3 =
            serde_json::from_value(serde_json::json!({"advertisedPort": 443, "advertiseMaxAge": "1h"})).unwrap();
        assert_eq!(h.alt_svc(8443), "h3=\":443\"; ma=3600");
    }

    #[test]
    fn bad_values_name_their_field() {
        let h: Http3 =
            serde_json::from_value(serde_json::json!({"idleTimeout": "0s", "streamWindowBytes": 10})).unwrap();
        let mut errors = Vec::new();
        check_http3("listeners[0].tls.http3", &h, &mut errors);
        let fields: Vec<_> = errors.iter().map(|e| e.field.clone()).collect();
        assert_eq!(
            fields,
            [
                "listeners[0].tls.http3.idleTimeout",
                "listeners[0].tls.http3.streamWindowBytes"
            ]
        );
    }
}
