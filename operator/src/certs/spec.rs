//! `spec.tls` and the certificate parts of the status.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use proxyfleet_config::HumanDuration;

/// Where the listeners' certificate comes from: the managed CA (default), cert-manager, an ACME
/// server, or an existing Secret. At most one may be given.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.managed) ? 1 : 0) + (has(self.certManager) ? 1 : 0) + (has(self.acme) ? 1 : 0) + (has(self.secretName) ? 1 : 0) <= 1").message("spec.tls: give at most one of managed, certManager, acme or secretName"))]
#[x_kube(validation = Rule::new("!has(self.acme) || !has(self.dnsNames) || self.dnsNames.all(n, !n.startsWith('*'))").message("spec.tls.dnsNames: ACME HTTP-01 cannot validate wildcard names").field_path(".dnsNames"))]
pub struct TlsSpec {
    /// Certificates issued by the operator's own CA (the default when nothing is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<ManagedTls>,
    /// Certificates issued by cert-manager through a Certificate the operator creates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_manager: Option<CertManagerTls>,
    /// Publicly trusted certificates from an ACME server (Let's Encrypt and others), validated
    /// over HTTP-01 by the fleet's own proxies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acme: Option<AcmeTls>,
    /// An existing `kubernetes.io/tls` Secret in the same namespace; only mounted and watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub secret_name: Option<String>,
    /// Extra DNS names for the certificate, besides listener hostnames and the Service names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(
            length(min = 1, max = 253),
            pattern(r"^([*][.])?[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        )
    )]
    pub dns_names: Vec<String>,
    /// Also issue a client certificate (mounted at /etc/proxyfleet/client) for mTLS to upstreams.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub upstream_client_certificate: bool,
}

/// Leaf certificates from the operator's CA.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.renewBefore) || duration(self.duration) > duration(self.renewBefore)").message("spec.tls.managed.renewBefore must be shorter than duration").field_path(".renewBefore"))]
#[x_kube(validation = Rule::new("duration(self.duration) >= duration('1m')").message("spec.tls.managed.duration must be at least 1m").field_path(".duration"))]
pub struct ManagedTls {
    /// Lifetime of a leaf certificate. Default 2160h (90 days).
    #[serde(default = "default_leaf_duration")]
    pub duration: HumanDuration,
    /// Renew this long before expiry. Default: a third of `duration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<HumanDuration>,
    /// Key algorithm of leaf certificates. Default ECDSAP256.
    #[serde(default)]
    pub key_algorithm: KeyAlgorithm,
}

impl Default for ManagedTls {
    fn default() -> Self {
        Self {
            duration: default_leaf_duration(),
            renew_before: None,
            key_algorithm: KeyAlgorithm::default(),
        }
    }
}

fn default_leaf_duration() -> HumanDuration {
    HumanDuration::from_secs(90 * 24 * 3600)
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum KeyAlgorithm {
    #[default]
    ECDSAP256,
    RSA2048,
}

/// An ACME account and directory. The operator keeps the account key in the Secret
/// `<name>-acme-account`, orders one certificate for every listener hostname and `dnsNames`,
/// answers the HTTP-01 challenges through every proxy of the fleet and renews at two thirds of
/// the lifetime.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcmeTls {
    /// The directory URL, e.g. https://acme-v02.api.letsencrypt.org/directory.
    #[schemars(length(min = 9, max = 2048), pattern(r"^https://[^\s]+$"))]
    pub directory: String,
    /// Contact address for the account (expiry notices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 254), pattern(r"^[^@\s]+@[^@\s]+$"))]
    pub email: Option<String>,
    /// External account binding, for CAs that require one (ZeroSSL, Google, Sectigo).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_account_binding: Option<ExternalAccountBinding>,
    /// A Secret in the fleet's namespace whose `ca.crt` is trusted for the directory's HTTPS,
    /// besides the public roots (a private ACME server such as step-ca or Pebble).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub directory_ca_secret: Option<String>,
}

/// The key id and HMAC key the CA handed out for binding the account.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalAccountBinding {
    #[schemars(length(min = 1, max = 256))]
    pub key_id: String,
    /// Secret (same namespace) and key holding the base64url HMAC key.
    pub hmac_key_secret: SecretKeyRef,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Where the fleet's ACME orders stand; enough to resume the backoff after a restart.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcmeStatus {
    /// Orders failed in a row since the last certificate.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    /// When the last order failed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<String>,
    /// Not before this time: the backoff, or the server's Retry-After (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_time: Option<String>,
    /// The server's words for the last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The account's URL on the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A cert-manager issuer reference.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertManagerTls {
    pub issuer_ref: IssuerRef,
    /// Requested lifetime, passed to the Certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<HumanDuration>,
    /// Requested renewal lead, passed to the Certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<HumanDuration>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Issuer or ClusterIssuer.
    #[serde(default)]
    pub kind: IssuerKind,
    /// API group of the issuer. Default cert-manager.io.
    #[serde(default = "default_issuer_group")]
    pub group: String,
}

fn default_issuer_group() -> String {
    "cert-manager.io".to_string()
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum IssuerKind {
    #[default]
    Issuer,
    ClusterIssuer,
}

/// One certificate the fleet uses.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateStatus {
    /// `serving`, `client` or `ca`.
    pub kind: String,
    pub secret_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<String>,
    /// When the operator will renew it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal_time: Option<String>,
    /// Where it comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<CertSource>,
}

/// The source of a fleet's certificate (`spec.tls`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum CertSource {
    Managed,
    CertManager,
    Acme,
    Secret,
}

/// Progress of a managed CA rotation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaRotationStatus {
    /// Stable, PublishingBundle, WaitingForBundle, Reissuing, Overlap.
    pub phase: RotationPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_ca_serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_ca_serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Where a namespace CA's rotation stands (recorded on the CA Secret, shown in status).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RotationPhase {
    #[default]
    Stable,
    PublishingBundle,
    WaitingForBundle,
    Reissuing,
    Overlap,
}

impl RotationPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stable => "Stable",
            Self::PublishingBundle => "PublishingBundle",
            Self::WaitingForBundle => "WaitingForBundle",
            Self::Reissuing => "Reissuing",
            Self::Overlap => "Overlap",
        }
    }

    /// The phase an annotation names; anything unknown is Stable (a hand edit never wedges a
    /// rotation).
    pub fn parse(s: &str) -> Self {
        [
            Self::PublishingBundle,
            Self::WaitingForBundle,
            Self::Reissuing,
            Self::Overlap,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
        .unwrap_or(Self::Stable)
    }
}

impl std::fmt::Display for RotationPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
