//! The contract between the proxy's admin `/config` and the operator (which reads it to know
//! which trust bundle and certificates each pod has loaded during a CA rotation): one serde
//! type, served as JSON, never a text parsed by line prefix.

use serde::{Deserialize, Serialize};

use crate::ProxyConfig;

/// Path of the report on the admin listener.
pub const ADMIN_REPORT_PATH: &str = "/config";

/// What a running proxy reports: its configuration (file paths, never key material) and what
/// it loaded from those files.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdminReport {
    pub config: ProxyConfig,
    /// Serving certificates loaded, per listener.
    pub certificates: Vec<LoadedCertificate>,
    /// SHA-256 (hex) of the trust bundle loaded from `trustBundleFiles`, when any.
    pub trust_bundle_sha256: Option<String>,
    /// Live weights applied, per route (absent: the configured weights rule).
    #[serde(default)]
    pub live_weights: Vec<crate::LiveWeights>,
    /// Tokens of the ACME HTTP-01 challenges answered (key authorizations are not shown).
    #[serde(default)]
    pub acme_tokens: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LoadedCertificate {
    pub listener: String,
    /// Hex serial number.
    pub serial: String,
    pub subject: String,
    /// Unix seconds.
    pub not_after: i64,
}

impl AdminReport {
    pub fn to_json(&self) -> String {
        // Plain data: serialising cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}
