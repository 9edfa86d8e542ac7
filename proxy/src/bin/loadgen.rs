//! proxyfleet-loadgen: a steady, rate-limited HTTP(S) load for e2e tests. Opens a new
//! connection every `--new-conn-every` requests per worker (so handshakes keep happening) and
//! keeps the others alive; counts outcomes and prints a JSON summary at the end.
//!
//!   proxyfleet-loadgen --url https://demo.example.com/ --connect 10.96.0.5:443 --ca ca.crt \
//!       --rate 50 --duration 60s [--workers 4] [--new-conn-every 20] [--summary out.json]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

#[derive(Parser, Clone)]
struct Args {
    #[arg(long)]
    url: http::Uri,
    /// Address to connect to instead of resolving the URL's host.
    #[arg(long)]
    connect: String,
    /// PEM CA bundle to verify the server (HTTPS).
    #[arg(long)]
    ca: Option<String>,
    /// Requests per second, all workers together.
    #[arg(long, default_value_t = 50)]
    rate: u64,
    #[arg(long, default_value = "30s")]
    duration: proxyfleet_config::HumanDuration,
    #[arg(long, default_value_t = 4)]
    workers: u64,
    #[arg(long, default_value_t = 20)]
    new_conn_every: u64,
    /// Also write the summary here.
    #[arg(long)]
    summary: Option<String>,
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    status_4xx: AtomicU64,
    status_5xx: AtomicU64,
    errors: AtomicU64,
    connections: AtomicU64,
    /// Connects refused or unreachable once, then retried (as client libraries do for a
    /// Service VIP whose endpoint set is changing). Reported, not hidden.
    connect_retries: AtomicU64,
    /// TCP connects that failed twice (refused/unreachable before any TLS byte): reported
    /// apart from `errors`, which counts TLS handshake and request failures.
    tcp_connect_failures: AtomicU64,
    /// Requests the server closed the connection under before reading them (keep-alive
    /// race), retried once on a new connection, as hyper-util's client does.
    request_retries: AtomicU64,
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(args: &Args, tls: &Option<tokio_rustls::TlsConnector>) -> Result<Sender, String> {
    let tcp = tokio::net::TcpStream::connect(&args.connect)
        .await
        .map_err(|e| format!("tcp: {e}"))?;
    let host = args.url.host().unwrap_or("localhost").to_string();
    let sender = match tls {
        Some(c) => {
            let name = ServerName::try_from(host).map_err(|e| e.to_string())?;
            let s = c.connect(name, tcp).await.map_err(|e| e.to_string())?;
            let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            send
        }
        None => {
            let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            send
        }
    };
    Ok(sender)
}

/// A TLS connector trusting the CA bundle at `path`.
fn tls_connector(path: &str) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(path).expect("reading --ca");
    use rustls::pki_types::pem::PemObject;
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem).flatten() {
        let _ = roots.add(c);
    }
    let cfg = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

impl Counts {
    /// Counts one request's outcome; false when the connection failed.
    fn record(&self, result: &Result<u16, String>) -> bool {
        let counter = match result {
            Ok(200..=399) => &self.ok,
            Ok(400..=499) => &self.status_4xx,
            Ok(_) => &self.status_5xx,
            Err(e) => {
                eprintln!("request: {e}");
                &self.errors
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result.is_ok()
    }

    /// The JSON summary printed (and written to --summary) at the end.
    fn summary(&self) -> String {
        let counts = self;
        format!(
            "{{\"ok\": {}, \"status_4xx\": {}, \"status_5xx\": {}, \"errors\": {}, \"connections\": {}, \"connect_retries\": {}, \"request_retries\": {}, \"tcp_connect_failures\": {}}}",
            counts.ok.load(Ordering::Relaxed),
            counts.status_4xx.load(Ordering::Relaxed),
            counts.status_5xx.load(Ordering::Relaxed),
            counts.errors.load(Ordering::Relaxed),
            counts.connections.load(Ordering::Relaxed),
            counts.connect_retries.load(Ordering::Relaxed),
            counts.request_retries.load(Ordering::Relaxed),
            counts.tcp_connect_failures.load(Ordering::Relaxed)
        )
    }
}

/// One worker: its share of the rate on a keep-alive connection, renewed every
/// `--new-conn-every` requests, until the deadline or SIGTERM.
async fn worker(
    args: Args,
    tls: Option<tokio_rustls::TlsConnector>,
    counts: Arc<Counts>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    deadline: Instant,
    per_worker: Duration,
) {
    let mut sender: Option<Sender> = None;
    let mut on_conn = 0;
    let mut tick = tokio::time::interval(per_worker);
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        if sender.is_none() || on_conn >= args.new_conn_every {
            let mut attempt = connect(&args, &tls).await;
            if attempt.is_err() {
                counts.connect_retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
                attempt = connect(&args, &tls).await;
            }
            match attempt {
                Ok(s) => {
                    counts.connections.fetch_add(1, Ordering::Relaxed);
                    sender = Some(s);
                    on_conn = 0;
                }
                Err(e) => {
                    if e.starts_with("tcp: ") {
                        counts.tcp_connect_failures.fetch_add(1, Ordering::Relaxed);
                    } else {
                        counts.errors.fetch_add(1, Ordering::Relaxed);
                    }
                    eprintln!("connect: {e}");
                    continue;
                }
            }
        }
        let Some(s) = sender.as_mut() else { continue };
        on_conn += 1;
        let make = || {
            http::Request::builder()
                .uri(args.url.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
                .header("host", args.url.host().unwrap_or("localhost"))
                .body(Empty::<Bytes>::new())
                .expect("request")
        };
        let mut sent = tokio::time::timeout(Duration::from_secs(10), s.send_request(make())).await;
        if matches!(&sent, Ok(Err(e)) if e.is_canceled()) {
            // The server closed this keep-alive connection before reading the request.
            counts.request_retries.fetch_add(1, Ordering::Relaxed);
            match connect(&args, &tls).await {
                Ok(mut fresh) => {
                    counts.connections.fetch_add(1, Ordering::Relaxed);
                    sent = tokio::time::timeout(Duration::from_secs(10), fresh.send_request(make())).await;
                    sender = Some(fresh);
                    on_conn = 1;
                }
                Err(e) => eprintln!("reconnect: {e}"),
            }
        }
        let result = match sent {
            Ok(Ok(resp)) => {
                let status = resp.status().as_u16();
                let _ = resp.into_body().collect().await;
                Ok(status)
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timeout".to_string()),
        };
        if !counts.record(&result) {
            sender = None;
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = args.ca.as_deref().map(tls_connector);
    let counts = Arc::new(Counts::default());
    // SIGTERM ends the run early; the summary is still written.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                term.recv().await;
                stop.store(true, Ordering::Relaxed);
            }
        });
    }
    let deadline = Instant::now() + args.duration.get();
    let per_worker = Duration::from_secs_f64(args.workers as f64 / args.rate.max(1) as f64);
    let mut tasks = Vec::new();
    for _ in 0..args.workers {
        let (args, tls, counts, stop) = (args.clone(), tls.clone(), counts.clone(), stop.clone());
        tasks.push(tokio::spawn(worker(args, tls, counts, stop, deadline, per_worker)));
    }
    for t in tasks {
        let _ = t.await;
    }
    let summary = counts.summary();
    println!("{summary}");
    if let Some(p) = args.summary {
        let _ = std::fs::write(p, summary);
    }
}
