//! Test support: certificates, TLS/plain upstream servers, a proxy started in-process, clients.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

pub fn init() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub struct TestCa {
    pub cert_pem: String,
    params: CertificateParams,
    key: KeyPair,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self {
            cert_pem: cert.pem(),
            params,
            key,
        }
    }

    /// (cert PEM, key PEM) for names.
    pub fn leaf(&self, names: &[&str]) -> (String, String) {
        let mut params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        let key = KeyPair::generate().unwrap();
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(self.cert_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        roots
    }
}

pub fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

pub fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "proxyfleet-test-{tag}-{}-{}",
        std::process::id(),
        fastrand_u64()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}

/// What an upstream saw.
#[derive(Default)]
pub struct UpstreamStats {
    pub connections: AtomicUsize,
    pub requests: AtomicUsize,
    pub h2_requests: AtomicUsize,
    pub resumed_handshakes: AtomicUsize,
    pub full_handshakes: AtomicUsize,
    /// Connections that negotiated TLS 1.2 and TLS 1.3.
    pub tls12_connections: AtomicUsize,
    pub tls13_connections: AtomicUsize,
    pub last_headers: Mutex<Option<http::HeaderMap>>,
    pub last_uri: Mutex<Option<http::Uri>>,
    /// When set, `/healthz` answers 503 (for active health check tests).
    pub unhealthy: std::sync::atomic::AtomicBool,
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub stats: Arc<UpstreamStats>,
}

async fn upstream_answer(
    req: http::Request<Incoming>,
    name: &'static str,
    stats: Arc<UpstreamStats>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    stats.requests.fetch_add(1, Ordering::Relaxed);
    if req.version() == http::Version::HTTP_2 {
        stats.h2_requests.fetch_add(1, Ordering::Relaxed);
    }
    *stats.last_headers.lock().unwrap() = Some(req.headers().clone());
    *stats.last_uri.lock().unwrap() = Some(req.uri().clone());
    let path = req.uri().path().to_string();
    let mut status = 200u16;
    if let Some(ms) = path.strip_prefix("/delay/").and_then(|s| s.parse::<u64>().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(code) = path.strip_prefix("/status/").and_then(|s| s.parse::<u16>().ok()) {
        status = code;
    }
    if path == "/healthz" && stats.unhealthy.load(Ordering::Relaxed) {
        status = 503;
    }
    let body = req.into_body().collect().await.map(|b| b.to_bytes().len()).unwrap_or(0);
    if let Some(n) = path.strip_prefix("/bytes/").and_then(|s| s.parse::<usize>().ok()) {
        return Ok(http::Response::new(Full::new(Bytes::from(vec![b'x'; n]))));
    }
    let mut r = http::Response::new(Full::new(Bytes::from(format!("{name} {path} {body}"))));
    *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
    Ok(r)
}

/// An upstream on 127.0.0.1. With `tls`, serves that cert (ALPN h2 + http/1.1, resumption on;
/// http/1.1 alone when `name` ends in `-h1only`).
/// With `close_each`, every HTTP/1.1 response closes its connection.
pub async fn upstream(name: &'static str, tls: Option<(String, String)>, close_each: bool) -> Upstream {
    upstream_verifying_clients(name, tls, None, close_each).await
}

/// [`upstream`], and with `client_ca` set, TLS clients must present a certificate it signed.
pub async fn upstream_verifying_clients(
    name: &'static str,
    tls: Option<(String, String)>,
    client_ca: Option<&TestCa>,
    close_each: bool,
) -> Upstream {
    let client_roots = client_ca.map(|ca| Arc::new(ca.roots()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(UpstreamStats::default());
    let acceptor = tls.map(|(cert, key)| {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
            .map(|c| c.unwrap())
            .collect();
        let key: PrivateKeyDer<'static> = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let builder = rustls::ServerConfig::builder();
        let builder = match client_roots {
            Some(roots) => {
                builder.with_client_cert_verifier(rustls::server::WebPkiClientVerifier::builder(roots).build().unwrap())
            }
            None => builder.with_no_client_auth(),
        };
        let mut cfg = builder.with_single_cert(certs, key).unwrap();
        cfg.alpn_protocols = if name.ends_with("-h1only") {
            vec![b"http/1.1".to_vec()]
        } else {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        };
        tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
    });
    let s = stats.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            s.connections.fetch_add(1, Ordering::Relaxed);
            let stats = s.clone();
            let counters = s.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| upstream_answer(req, name, stats.clone()));
                let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                b.http1().keep_alive(!close_each);
                match acceptor {
                    Some(a) => {
                        let Ok(tls) = a.accept(tcp).await else { return };
                        match tls.get_ref().1.protocol_version() {
                            Some(rustls::ProtocolVersion::TLSv1_2) => {
                                counters.tls12_connections.fetch_add(1, Ordering::Relaxed)
                            }
                            _ => counters.tls13_connections.fetch_add(1, Ordering::Relaxed),
                        };
                        match tls.get_ref().1.handshake_kind() {
                            Some(rustls::HandshakeKind::Resumed) => {
                                counters.resumed_handshakes.fetch_add(1, Ordering::Relaxed)
                            }
                            _ => counters.full_handshakes.fetch_add(1, Ordering::Relaxed),
                        };
                        let _ = b.serve_connection(TokioIo::new(tls), svc).await;
                    }
                    None => {
                        let _ = b.serve_connection(TokioIo::new(tcp), svc).await;
                    }
                }
            });
        }
    });
    Upstream { addr, stats }
}

pub struct Proxy {
    pub running: proxyfleet_proxy::RunningProxy,
    pub config_path: PathBuf,
}

impl Proxy {
    pub fn addr(&self, listener: &str) -> SocketAddr {
        self.running.listener_addrs[listener]
    }
    pub fn admin(&self) -> SocketAddr {
        self.running.admin_addr
    }
}

pub async fn start_proxy(dir: &Path, yaml: &str) -> Proxy {
    let path = dir.join("proxy.yaml");
    std::fs::write(&path, yaml).unwrap();
    let config = proxyfleet_proxy::read_config(&path).unwrap();
    let running = proxyfleet_proxy::start(config, Some(path.clone())).await.unwrap();
    Proxy {
        running,
        config_path: path,
    }
}

/// `fut`, or a panic naming `step` when it has not finished within 20 s: a test that would
/// hang says which step waits.
pub async fn within<F: std::future::Future>(step: &str, fut: F) -> F::Output {
    match tokio::time::timeout(Duration::from_secs(20), fut).await {
        Ok(out) => out,
        Err(_) => panic!("{step}: still waiting after 20 s"),
    }
}

/// One HTTP/1.1 request on a fresh plain connection: (status, body).
pub async fn get(addr: SocketAddr, host: &str, path: &str) -> (u16, String) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    h1_get(tcp, host, path).await.unwrap()
}

/// One HTTP/1.1 GET over `io`: (status, body; empty if the body failed). An error when the
/// connection failed before a response head (e.g. a TLS 1.3 server refusing the client
/// certificate after the handshake).
pub async fn h1_get<I>(io: I, host: &str, path: &str) -> Result<(u16, String), String>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// A TLS connection with SNI `sni` (None: no SNI) trusting `ca`; returns the stream.
pub async fn tls_connect(
    addr: SocketAddr,
    sni: Option<&str>,
    ca: &TestCa,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    tls_connect_as(addr, sni, ca, alpn, None).await.unwrap()
}

/// [`tls_connect`] presenting `client_cert` (cert PEM, key PEM) when given; errors are returned.
pub async fn tls_connect_as(
    addr: SocketAddr,
    sni: Option<&str>,
    ca: &TestCa,
    alpn: &[&[u8]],
    client_cert: Option<&(String, String)>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let builder = rustls::ClientConfig::builder().with_root_certificates(ca.roots());
    let mut cfg = match client_cert {
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
                .map(|c| c.unwrap())
                .collect();
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    cfg.enable_sni = sni.is_some();
    let name = ServerName::try_from(sni.unwrap_or("default.example.com").to_string()).unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await
}

pub fn served_dns_names(stream: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> Vec<String> {
    let certs = stream.get_ref().1.peer_certificates().unwrap();
    proxyfleet_proxy::tls::describe(&certs[0]).unwrap().dns_names
}

pub fn served_serial(stream: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> String {
    let certs = stream.get_ref().1.peer_certificates().unwrap();
    proxyfleet_proxy::tls::describe(&certs[0]).unwrap().serial
}

/// GET over an established TLS stream, with h2 when negotiated.
pub async fn tls_get(
    stream: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    host: &str,
    path: &str,
) -> (u16, String, http::Version) {
    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(stream);
    let resp = if h2 {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = http::Request::builder()
            .uri(format!("https://{host}{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let req = http::Request::builder()
            .uri(path)
            .header("host", host)
            .body(Full::new(Bytes::new()))
            .unwrap();
        send.send_request(req).await.unwrap()
    };
    let status = resp.status().as_u16();
    let version = resp.version();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    (status, body, version)
}

/// The admin /metrics text.
pub async fn metrics(proxy: &Proxy) -> String {
    get(proxy.admin(), "admin", "/metrics").await.1
}

/// The admin /metrics text once `settled` holds of it, or whatever it is after 10 s. For counters
/// a task adds after the client has seen its end (a relay's, a mirror's).
pub async fn metrics_when(proxy: &Proxy, settled: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let m = metrics(proxy).await;
        if settled(&m) || tokio::time::Instant::now() >= deadline {
            return m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Sum of a metric's samples whose line contains all `parts`.
pub fn metric_sum(text: &str, name: &str, parts: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && parts.iter().all(|p| l.contains(p)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Sends raw bytes on a fresh connection and returns what came back (until close or 2 s).
pub async fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = tcp.write_all(bytes).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), tcp.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// An HTTP/2 prior-knowledge client connection to `addr`: the sender, and the connection's
/// task (it completes when the connection ends).
pub async fn h2_client(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<Bytes>>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .expect("h2 prior knowledge");
    (sender, tokio::spawn(conn))
}

/// PUTs `body` to the proxy's admin listener at `path` with a bearer token.
pub async fn admin_put(proxy: &Proxy, path: &str, token: &str, body: &str) -> (u16, String) {
    let tcp = tokio::net::TcpStream::connect(proxy.admin()).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::put(path)
        .header("host", "admin")
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A tonic server (h2c) with the standard health service; "app" is SERVING.
pub async fn grpc_upstream() -> std::net::SocketAddr {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("app", tonic_health::ServingStatus::Serving)
        .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _keep = reporter;
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream_of(listener))
            .await
            .unwrap();
    });
    addr
}

fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures_util::Stream<Item = Result<tokio::net::TcpStream, std::io::Error>> {
    futures_util::stream::unfold(listener, |l| async move {
        let r = l.accept().await.map(|(s, _)| s);
        Some((r, l))
    })
}
