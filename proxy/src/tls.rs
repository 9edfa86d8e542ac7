//! TLS on both sides: the listeners' server configs (SNI certificate selection, mTLS,
//! resumption) and the upstreams' client configs (verification, client certs, resumption).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, StoresServerSessions, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use sha2::{Digest, Sha256};

use proxyfleet_config::{CertificateFiles, ListenerTls, TlsVersion, UpstreamTls};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{what} {path} holds no PEM {expected}")]
    Empty {
        what: &'static str,
        path: String,
        expected: &'static str,
    },
    #[error("private key {path} is not usable: {source}")]
    Key { path: String, source: rustls::Error },
    #[error("certificate {path} does not match its private key {key_path}")]
    Mismatch { path: String, key_path: String },
    #[error("building TLS config for {what}: {source}")]
    Build { what: String, source: rustls::Error },
    #[error("client CA {path}: {message}")]
    ClientCa { path: String, message: String },
}

fn read(what: &'static str, path: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_string(),
        source,
    })
}

pub fn load_certs(what: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok).collect();
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_string(),
            expected: "CERTIFICATE",
        });
    }
    Ok(certs)
}

fn load_key(path: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    // The key's bytes never reach a log or an error message: only its path does.
    let pem = read("private key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).ok().ok_or_else(|| TlsError::Empty {
        what: "private key",
        path: path.to_string(),
        expected: "PRIVATE KEY",
    })
}

/// The proxy's TLS provider (docs/decisions.md: both libraries measured), its cipher suites
/// with AES-128-GCM first, as Go's crypto/tls, BoringSSL and Envoy order them:
/// 10 AES rounds instead of 14, and SHA-256 (which has CPU instructions on current x86, unlike
/// SHA-384) for every handshake, with security margins no one disputes. As a client (to
/// upstreams) this is what we offer; as a server rustls follows the client's order (Mozilla's
/// advice: a client knows whether it has AES hardware), so this only decides for clients
/// that have no preference. docs/decisions.md.
///
/// The record layer (the cipher suites: AES-GCM per record, HKDF) is ring's: for the small
/// records of an ordinary request it costs less than aws-lc-rs's (profiled, session 24: 0.86 vs
/// 1.11 µs of AES-GCM per keep-alive request, four records); the handshake (key exchange,
/// signatures, tickets) stays on aws-lc-rs, which is what made full handshakes faster.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.cipher_suites = rustls::crypto::ring::default_provider().cipher_suites;
    provider.cipher_suites.sort_by_key(|s| cipher_rank(s.suite()));
    Arc::new(provider)
}

fn cipher_rank(suite: rustls::CipherSuite) -> u8 {
    use rustls::CipherSuite as C;
    match suite {
        C::TLS13_AES_128_GCM_SHA256 => 0,
        C::TLS13_AES_256_GCM_SHA384 => 1,
        C::TLS13_CHACHA20_POLY1305_SHA256 => 2,
        C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 3,
        C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 | C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => 4,
        _ => 5,
    }
}

/// What the proxy reports about a served certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateInfo {
    pub subject: String,
    pub serial: String,
    pub not_after_unix: i64,
    pub dns_names: Vec<String>,
}

pub fn describe(cert: &CertificateDer<'_>) -> Option<CertificateInfo> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let dns_names = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Some(CertificateInfo {
        subject: parsed.subject().to_string(),
        serial: parsed.raw_serial_as_string().replace(':', ""),
        not_after_unix: parsed.validity().not_after.timestamp(),
        dns_names,
    })
}

/// One loaded certificate with the names it serves.
pub struct LoadedCertificate {
    pub key: Arc<CertifiedKey>,
    pub info: CertificateInfo,
    pub names: Vec<String>,
    pub default: bool,
    /// What became of the OCSP response beside it (None: there is none).
    pub ocsp: Option<Result<StapledUntil, crate::ocsp::Refusal>>,
}

/// A stapled key is served until `until_unix`, then `plain` (the same key, no staple).
#[derive(Clone)]
pub struct StapledUntil {
    pub until_unix: i64,
    pub plain: Arc<CertifiedKey>,
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Staples the response in `path`, if there is one and it is fit (see `ocsp::check`).
fn staple(
    certified: &mut CertifiedKey,
    path: Option<&str>,
) -> Result<Option<Result<StapledUntil, crate::ocsp::Refusal>>, TlsError> {
    let Some(path) = path else { return Ok(None) };
    let response = match std::fs::read(path) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TlsError::Read {
                what: "OCSP response",
                path: path.to_string(),
                source,
            })
        }
    };
    let checked = crate::ocsp::check(
        &response,
        certified.end_entity_cert().map_or(&[], |c| c.as_ref()),
        now_unix(),
    );
    Ok(Some(checked.map(|s| {
        let plain = Arc::new(certified.clone());
        certified.ocsp = Some(s.der);
        StapledUntil {
            until_unix: s.valid_until_unix,
            plain,
        }
    })))
}

pub fn load_certificate(files: &CertificateFiles) -> Result<LoadedCertificate, TlsError> {
    let chain = load_certs("certificate", &files.cert_file)?;
    let key = load_key(&files.key_file)?;
    let signing_key = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|source| TlsError::Key {
            path: files.key_file.clone(),
            source,
        })?;
    let mut certified = CertifiedKey::new(chain, signing_key);
    if certified.keys_match().is_err() {
        return Err(TlsError::Mismatch {
            path: files.cert_file.clone(),
            key_path: files.key_file.clone(),
        });
    }
    let info = describe(&certified.cert[0]).unwrap_or(CertificateInfo {
        subject: String::new(),
        serial: String::new(),
        not_after_unix: 0,
        dns_names: Vec::new(),
    });
    // Explicit serverNames win; otherwise the certificate's own DNS SANs are its names.
    let names = if files.server_names.is_empty() {
        info.dns_names.clone()
    } else {
        files.server_names.iter().map(|n| n.to_ascii_lowercase()).collect()
    };
    let ocsp = staple(&mut certified, files.ocsp_file.as_deref())?;
    Ok(LoadedCertificate {
        key: Arc::new(certified),
        info,
        names,
        default: files.default,
        ocsp,
    })
}

/// Certificates of one listener, selected by SNI: exact name, then the wildcard of the
/// parent domain, then the default.
#[derive(Default)]
pub struct SniCertificates {
    exact: HashMap<String, Arc<CertifiedKey>>,
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
    /// Keys with an OCSP staple, and when the staple must stop being served.
    staples: Vec<(Arc<CertifiedKey>, StapledUntil)>,
    /// Counts the first handshake after a staple's nextUpdate (the response was not renewed).
    staple_expired: Option<prometheus_client::metrics::counter::Counter>,
    expired_counted: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for SniCertificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SniCertificates")
            .field("exact", &self.exact.keys().collect::<Vec<_>>())
            .field("wildcard", &self.wildcard.keys().collect::<Vec<_>>())
            .field("default", &self.default.is_some())
            .finish()
    }
}

impl SniCertificates {
    pub fn new(certs: &[LoadedCertificate]) -> Self {
        let mut s = Self::default();
        for c in certs {
            for n in &c.names {
                match n.strip_prefix("*.") {
                    Some(suffix) => s.wildcard.entry(suffix.to_string()).or_insert_with(|| c.key.clone()),
                    None => s.exact.entry(n.clone()).or_insert_with(|| c.key.clone()),
                };
            }
            if c.default {
                s.default = Some(c.key.clone());
            }
            if let Some(Ok(stapled)) = &c.ocsp {
                s.staples.push((c.key.clone(), stapled.clone()));
            }
        }
        // With a single certificate and no explicit default, serve it to everyone.
        if s.default.is_none() && certs.len() == 1 {
            s.default = Some(certs[0].key.clone());
        }
        s
    }

    pub fn select(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = server_name {
            let name = name.trim_end_matches('.');
            let lower;
            let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
                lower = name.to_ascii_lowercase();
                lower.as_str()
            } else {
                name
            };
            if let Some(k) = self.exact.get(name) {
                return Some(k.clone());
            }
            if let Some((_, parent)) = name.split_once('.') {
                if let Some(k) = self.wildcard.get(parent) {
                    return Some(k.clone());
                }
            }
        }
        self.default.clone()
    }
}

impl SniCertificates {
    /// Whether `host` would have been served the same certificate as `sni` (RFC 9110 §7.4:
    /// a connection carries requests only for origins it was set up for). A host that selects
    /// another of the listener's certificates is misdirected (its own certificate, and any
    /// mTLS or routing tied to it, must not be bypassed by reusing a connection); one that
    /// falls to the same certificate, the default included, is not. Asked only when the two
    /// names differ, so the common request never gets here.
    pub fn covers(&self, sni: &str, host: &str) -> bool {
        match (self.select(Some(sni)), self.select(Some(host))) {
            (Some(served), Some(for_host)) => Arc::ptr_eq(&served, &for_host),
            (None, None) => true,
            _ => false,
        }
    }
}

impl SniCertificates {
    /// Counts in `counter` when a stapled response outlives its nextUpdate.
    pub fn with_staple_expiry_counter(mut self, counter: prometheus_client::metrics::counter::Counter) -> Self {
        self.staple_expired = Some(counter);
        self
    }

    /// The key without its staple once the staple has expired (checked only for stapled keys).
    fn unstapled_if_expired(&self, key: &Arc<CertifiedKey>) -> Option<Arc<CertifiedKey>> {
        let (_, stapled) = self.staples.iter().find(|(k, _)| Arc::ptr_eq(k, key))?;
        if now_unix() < stapled.until_unix {
            return None;
        }
        if !self.expired_counted.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!("an OCSP staple passed its nextUpdate; serving without it until a fresh response is stored");
            if let Some(c) = &self.staple_expired {
                c.inc();
            }
        }
        Some(stapled.plain.clone())
    }
}

impl ResolvesServerCert for SniCertificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let key = self.select(hello.server_name())?;
        if key.ocsp.is_some() {
            if let Some(plain) = self.unstapled_if_expired(&key) {
                return Some(plain);
            }
        }
        Some(key)
    }
}

/// A listener's session-resumption stores, shared by every rebuild of its ServerConfig so a
/// reload keeps client sessions resumable, as long as the client CA it trusts is the same: a
/// resumed session is not verified again, so a session from before a change of trust must not
/// resume after it (nginx and BoringSSL key their session context on the CA list likewise).
pub struct ServerResumption {
    current: std::sync::Mutex<(Option<[u8; 32]>, Arc<ResumptionStores>)>,
}

/// The session cache (TLS 1.2 IDs, TLS 1.3 stateful tickets) and the ticket keys.
pub struct ResumptionStores {
    pub cache: Arc<dyn StoresServerSessions>,
    pub ticketer: Option<Arc<dyn rustls::server::ProducesTickets>>,
}

impl ResumptionStores {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            cache: rustls::server::ServerSessionMemoryCache::new(16 * 1024),
            ticketer: rustls::crypto::aws_lc_rs::Ticketer::new().ok(),
        })
    }
}

impl ServerResumption {
    pub fn new() -> Self {
        Self {
            current: std::sync::Mutex::new((None, ResumptionStores::new())),
        }
    }

    /// The stores for a config trusting the client CA whose fingerprint is `client_ca`: the
    /// current ones, or new ones when the trust changed (every earlier session is forgotten).
    pub fn stores_for(&self, client_ca: Option<[u8; 32]>) -> Arc<ResumptionStores> {
        let mut current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.0 != client_ca {
            *current = (client_ca, ResumptionStores::new());
        }
        current.1.clone()
    }
}

impl Default for ServerResumption {
    fn default() -> Self {
        Self::new()
    }
}

pub fn key_log() -> Option<Arc<dyn rustls::KeyLog>> {
    std::env::var_os("SSLKEYLOGFILE").map(|_| Arc::new(rustls::KeyLogFile::new()) as Arc<dyn rustls::KeyLog>)
}

/// Builds a listener's ServerConfig: TLS 1.2 + 1.3 only, ALPN h2 + http/1.1.
pub fn server_config(
    listener: &str,
    tls: &ListenerTls,
    certs: Arc<SniCertificates>,
    resumption: &ServerResumption,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|source| TlsError::Build {
            what: listener.to_string(),
            source,
        })?;
    let mut client_ca = None;
    let builder = match &tls.client_ca_file {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            let mut fingerprint = Sha256::new();
            for c in load_certs("client CA", path)? {
                fingerprint.update(c.as_ref());
                roots.add(c).map_err(|e| TlsError::ClientCa {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError::ClientCa {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            client_ca = Some(fingerprint.finalize().into());
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(certs);
    // "http/1.0" too: a client that offers only it (curl --http1.0) would otherwise get rustls'
    // fatal no_application_protocol alert, where nginx and HAProxy serve it.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec(), b"http/1.0".to_vec()];
    if tls.session_resumption {
        let stores = resumption.stores_for(client_ca);
        config.session_storage = stores.cache.clone();
        if let Some(t) = &stores.ticketer {
            config.ticketer = t.clone();
            config.send_tls13_tickets = 2;
        }
    } else {
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
    }
    if let Some(k) = key_log() {
        config.key_log = k;
    }
    Ok(Arc::new(config))
}

/// Accepts any upstream certificate. Only with `insecureSkipVerify`, for tests.
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Builds an upstream's ClientConfig. Its session store (resumption per server name)
/// lives as long as the upstream's configuration.
pub fn client_config(
    upstream: &str,
    tls: &UpstreamTls,
    alpn: &[&[u8]],
    tickets_per_server: usize,
) -> Result<Arc<ClientConfig>, TlsError> {
    let versions: &[&'static rustls::SupportedProtocolVersion] = match tls.max_version {
        Some(TlsVersion::Tls12) => &[&rustls::version::TLS12],
        Some(TlsVersion::Tls13) | None => &[&rustls::version::TLS13, &rustls::version::TLS12],
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .map_err(|source| TlsError::Build {
            what: upstream.to_string(),
            source,
        })?;
    let builder = if tls.insecure_skip_verify {
        tracing::warn!(upstream, "upstream TLS verification is DISABLED (insecureSkipVerify)");
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider())))
    } else {
        let mut roots = RootCertStore::empty();
        if let Some(path) = &tls.ca_file {
            for c in load_certs("upstream CA", path)? {
                roots.add(c).map_err(|e| TlsError::ClientCa {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            }
        }
        builder.with_root_certificates(roots)
    };
    let mut config = match &tls.client_certificate {
        Some(files) => {
            let chain = load_certs("client certificate", &files.cert_file)?;
            let key = load_key(&files.key_file)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|source| TlsError::Key {
                    path: files.key_file.clone(),
                    source,
                })?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config.resumption = if tls.session_resumption {
        rustls::client::Resumption::store(Arc::new(crate::upstream::sessions::UpstreamSessionStore::new(
            tickets_per_server,
        )))
    } else {
        rustls::client::Resumption::disabled()
    };
    if let Some(k) = key_log() {
        config.key_log = k;
    }
    Ok(Arc::new(config))
}

/// SHA-256 of the concatenated trust bundle files, hex, for confirming CA rotation. A file
/// that does not exist is left out, and none at all is no fingerprint: a certificate Secret
/// the user made (`kubectl create secret tls`) has no `ca.crt`, and only the managed CA's
/// rotation reads the fingerprint. A file that exists but cannot be read is an error.
pub fn bundle_fingerprint(paths: &[String]) -> Result<Option<String>, TlsError> {
    let mut h = Sha256::new();
    let mut found = false;
    for p in paths {
        match std::fs::read(p) {
            Ok(bytes) => {
                h.update(bytes);
                found = true;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(TlsError::Read {
                    what: "trust bundle",
                    path: p.clone(),
                    source,
                })
            }
        }
    }
    Ok(found.then(|| hex(&h.finalize())))
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The directories to watch for a set of files (Kubernetes swaps a symlink in the directory).
pub fn parent_dirs<'a>(paths: impl Iterator<Item = &'a str>) -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = paths
        .filter_map(|p| Path::new(p).parent())
        // A bare file name is in the working directory.
        .map(|d| if d.as_os_str().is_empty() { Path::new(".") } else { d }.to_path_buf())
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

#[cfg(test)]
mod tests {
    use rustls::CipherSuite as C;

    #[test]
    fn aes_128_gcm_comes_first_for_both_versions() {
        let suites: Vec<C> = super::provider().cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(suites[0], C::TLS13_AES_128_GCM_SHA256);
        let tls12 = suites
            .iter()
            .position(|s| *s == C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)
            .unwrap();
        let tls12_256 = suites
            .iter()
            .position(|s| *s == C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384)
            .unwrap();
        assert!(tls12 < tls12_256);
        // Nothing dropped: the provider's full set, reordered.
        assert_eq!(
            suites.len(),
            rustls::crypto::aws_lc_rs::default_provider().cipher_suites.len()
        );
    }

    /// A Secret without `ca.crt` (made by `kubectl create secret tls`) gives no fingerprint,
    /// not a proxy that cannot start.
    #[test]
    fn a_missing_trust_bundle_file_is_no_fingerprint() {
        let dir = std::env::temp_dir().join(format!("pf-bundle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("absent.crt").display().to_string();
        assert_eq!(super::bundle_fingerprint(std::slice::from_ref(&missing)).unwrap(), None);
        let present = dir.join("ca.crt");
        std::fs::write(&present, b"bundle").unwrap();
        let both = [missing, present.display().to_string()];
        let fingerprint = super::bundle_fingerprint(&both).unwrap();
        assert_eq!(fingerprint.map(|f| f.len()), Some(64));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_expired_staple_is_no_longer_served() {
        use super::*;
        let generated = rcgen::generate_simple_self_signed(vec!["a.example.com".to_string()]).unwrap();
        let key = PrivateKeyDer::Pkcs8(generated.signing_key.serialize_der().into());
        let signing = provider().key_provider.load_private_key(key).unwrap();
        let plain = Arc::new(CertifiedKey::new(vec![generated.cert.der().clone()], signing));
        let mut stapled = (*plain).clone();
        stapled.ocsp = Some(vec![1, 2, 3]);
        let loaded = |until_unix| LoadedCertificate {
            key: Arc::new(stapled.clone()),
            info: describe(generated.cert.der()).unwrap(),
            names: vec!["a.example.com".into()],
            default: true,
            ocsp: Some(Ok(StapledUntil {
                until_unix,
                plain: plain.clone(),
            })),
        };
        let fresh = SniCertificates::new(&[loaded(now_unix() + 60)]);
        let key = fresh.select(Some("a.example.com")).unwrap();
        assert!(fresh.unstapled_if_expired(&key).is_none());
        let counter = prometheus_client::metrics::counter::Counter::default();
        let expired = SniCertificates::new(&[loaded(now_unix() - 1)]).with_staple_expiry_counter(counter.clone());
        let key = expired.select(Some("a.example.com")).unwrap();
        for _ in 0..3 {
            let served = expired.unstapled_if_expired(&key).unwrap();
            assert!(served.ocsp.is_none());
        }
        assert_eq!(counter.get(), 1, "counted once");
    }
}
