//! A listener that relays TCP connections instead of serving HTTP: TLS passthrough routed by
//! the ClientHello's SNI (the backend keeps its own certificate), or plain TCP to one upstream.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::HumanDuration;

/// How a TCP listener picks its upstream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TcpMode {
    /// Read the TLS ClientHello, route by its SNI, relay the bytes untouched (TLS is not
    /// terminated: the backend's own certificate, end-to-end mTLS possible).
    #[default]
    TlsPassthrough,
    /// Relay every connection to `defaultUpstream`, reading nothing.
    Tcp,
    /// A SOCKS5 forward proxy (RFC 1928 CONNECT): the target must pass the fleet's `connect`
    /// allow-list and address checks, as for HTTP CONNECT.
    Socks5,
}

/// The relay settings of a TCP listener.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpProxy {
    /// `tlsPassthrough` (default) or `tcp`.
    #[serde(default)]
    pub mode: TcpMode,
    /// SNI routes (tlsPassthrough), matched in order; the first match wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub routes: Vec<SniRoute>,
    /// Where connections go that no route matches (no SNI, or an unknown name); refused when
    /// absent. Required in `tcp` mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub default_upstream: Option<String>,
    /// A connection with no byte either way for this long is closed. Default 1h.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout: HumanDuration,
    /// The ClientHello must arrive within this long. Default 10s.
    #[serde(default = "default_hello_timeout")]
    pub client_hello_timeout: HumanDuration,
    /// Send a PROXY protocol v2 header to the upstream first, so it sees the client's address.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub proxy_protocol: bool,
    /// SOCKS5 authentication (mode socks5); no authentication when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socks5: Option<Socks5Auth>,
}

/// SOCKS5 username/password authentication (RFC 1929): one user, from a Secret.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.credentialsDir)",
    "message": "credentialsDir is for the standalone proxy; in a ProxyDeployment name credentialsSecret"
}, {
    "rule": "has(self.credentialsSecret)",
    "message": "credentialsSecret is required: a Secret with username and password keys"
}]))]
pub struct Socks5Auth {
    /// In a ProxyDeployment: a Secret of the fleet's namespace with `username` and `password`
    /// keys (the shape of a `kubernetes.io/basic-auth` Secret), mounted and hot-reloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub credentials_secret: Option<String>,
    /// Standalone proxy: a directory holding `username` and `password` files; re-read when they
    /// change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub credentials_dir: Option<String>,
}

/// The files a SOCKS5 credentials directory holds.
pub const SOCKS5_USERNAME_FILE: &str = "username";
pub const SOCKS5_PASSWORD_FILE: &str = "password";

/// Connections whose SNI matches one of `serverNames` go to `upstream`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SniRoute {
    /// Name of the route, used in metrics.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Exact (`db.example.com`) or wildcard (`*.example.com`) names.
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 253)))]
    pub server_names: Vec<String>,
    /// One of `upstreams[].name`: its endpoints, balancing, connect timeout, connection limit
    /// and outlier detection apply; its `tls` and `protocol` do not (the bytes pass as they are).
    #[schemars(length(min = 1, max = 63))]
    pub upstream: String,
}

fn default_idle_timeout() -> HumanDuration {
    HumanDuration::from_secs(3600)
}
fn default_hello_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
