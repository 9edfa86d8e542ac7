//! Per-route middleware in front of the upstream: JWT validation and CORS (answered by the
//! proxy, as Envoy's `jwt_authn` and `cors` filters do).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::HumanDuration;

/// Validate a bearer JWT (`Authorization: Bearer …`) before a request reaches the upstream.
/// A request without a valid token gets 401 with `WWW-Authenticate`; the token is never logged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
// The rules are the CRD's (the standalone proxy does not evaluate CEL): in a ProxyDeployment the
// key set comes from a Secret or ConfigMap, never from a path inside the pod.
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.jwksFile)",
    "message": "jwksFile is for the standalone proxy; in a ProxyDeployment name jwksSecret or jwksConfigMap"
}, {
    "rule": "has(self.jwksSecret) != has(self.jwksConfigMap)",
    "message": "give exactly one of jwksSecret or jwksConfigMap"
}]))]
pub struct JwtAuth {
    /// The `iss` a token must carry; any issuer when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub issuer: Option<String>,
    /// A token's `aud` must name one of these; not checked when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 1024)))]
    pub audiences: Vec<String>,
    /// A JSON Web Key Set file (standalone proxy); re-read when it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub jwks_file: Option<String>,
    /// In a ProxyDeployment: a Secret of the fleet's namespace whose `jwks.json` holds the key
    /// set, mounted into the pods and hot-reloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub jwks_secret: Option<String>,
    /// In a ProxyDeployment: a ConfigMap of the fleet's namespace whose `jwks.json` holds the
    /// key set (public keys need no Secret), mounted into the pods and hot-reloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub jwks_config_map: Option<String>,
    /// Signature algorithms accepted. Default all three: RS256, ES256, EdDSA.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub algorithms: Vec<JwtAlgorithm>,
    /// Leeway on `exp` and `nbf` for clocks that disagree. Default 60s.
    #[serde(default = "default_clock_skew")]
    pub clock_skew: HumanDuration,
    /// Pass the `Authorization` header on to the upstream. Default false: the token is
    /// removed, as Envoy does, so it cannot leak further than it must.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forward_token: bool,
    /// Claims copied into request headers for the upstream. A header of that name sent by the
    /// client is always removed first, so it cannot be forged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub claim_headers: Vec<ClaimHeader>,
}

/// A JWS signature algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum JwtAlgorithm {
    RS256,
    ES256,
    EdDSA,
}

impl JwtAlgorithm {
    pub const ALL: [JwtAlgorithm; 3] = [JwtAlgorithm::RS256, JwtAlgorithm::ES256, JwtAlgorithm::EdDSA];
}

/// One claim forwarded as a request header.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimHeader {
    /// A top-level claim (`sub`, `email`, `scope`, …). Strings are sent as they are, numbers
    /// and booleans as JSON, arrays of strings joined with `,`.
    #[schemars(length(min = 1, max = 128))]
    pub claim: String,
    /// The request header to set, e.g. `x-user-id`.
    #[schemars(length(min = 1, max = 128))]
    pub header: String,
}

/// Cross-origin resource sharing: preflights answered by the proxy, and the CORS response
/// headers added for allowed origins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!(has(self.allowCredentials) && self.allowCredentials && self.allowOrigins.exists(o, o == '*'))",
    "message": "allowCredentials cannot be used with the * origin (browsers refuse it); list the origins"
}]))]
pub struct Cors {
    /// Origins allowed: exact (`https://app.example.com`), a subdomain wildcard
    /// (`https://*.example.com`), or `*` for any.
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 263)))]
    pub allow_origins: Vec<String>,
    /// Methods a preflight may ask for. Default GET, HEAD, POST.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 32)))]
    pub allow_methods: Vec<String>,
    /// Request headers a preflight may ask for; `*` allows any (without credentials).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 128)))]
    pub allow_headers: Vec<String>,
    /// Response headers the browser may show to scripts (`Access-Control-Expose-Headers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 128)))]
    pub expose_headers: Vec<String>,
    /// Allow cookies and credentials (`Access-Control-Allow-Credentials: true`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_credentials: bool,
    /// How long a browser may cache a preflight answer (`Access-Control-Max-Age`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<HumanDuration>,
}

fn default_clock_skew() -> HumanDuration {
    HumanDuration::from_secs(60)
}
