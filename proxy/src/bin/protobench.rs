//! proxyfleet-protobench: one closed-loop load generator for HTTP/1.1, HTTP/2 and HTTP/3 over
//! TLS, so the three protocols are compared by the same client code (h2load has no HTTP/3 in
//! Debian). `--connections` connections, each with `--streams` requests in flight (HTTP/1.1:
//! one), for `--duration`; prints requests/s and latency percentiles as JSON.
//!
//!   proxyfleet-protobench --proto h3 --connect 127.0.0.1:18443 --name localhost --ca ca.crt \
//!       --connections 4 --streams 8 --duration 10s

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use proxyfleet_proxy::http3::client::{client_config, endpoint, Client};
use rustls::pki_types::ServerName;

#[derive(Clone, Copy, ValueEnum)]
enum Proto {
    H1,
    H2,
    H3,
}

#[derive(Parser)]
struct Args {
    #[arg(long, value_enum)]
    proto: Proto,
    #[arg(long)]
    connect: SocketAddr,
    /// SNI and Host.
    #[arg(long, default_value = "localhost")]
    name: String,
    /// PEM CA bundle that verifies the server.
    #[arg(long)]
    ca: String,
    #[arg(long, default_value = "/")]
    path: String,
    #[arg(long, default_value_t = 4)]
    connections: usize,
    #[arg(long, default_value_t = 1)]
    streams: usize,
    #[arg(long, default_value = "10s")]
    duration: proxyfleet_config::HumanDuration,
}

fn roots(path: &str) -> rustls::RootCertStore {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(path)
        .expect("the CA file")
        .flatten()
    {
        let _ = roots.add(c);
    }
    roots
}

/// Each request's latency (µs), and the errors.
type Outcome = (Vec<u32>, u64);

/// One request stream of a connection, of whichever protocol.
enum Stream {
    H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
    H3(proxyfleet_proxy::http3::client::Sender),
}

impl Stream {
    async fn get(&mut self, uri: &http::Uri, host: &str) -> bool {
        match self {
            Stream::H3(s) => {
                let req = http::Request::get(uri.clone()).body(Bytes::new()).expect("request");
                s.request(req).await.is_ok_and(|r| r.head.status().is_success())
            }
            Stream::H2(s) => {
                let req = http::Request::get(uri.clone()).body(Empty::new()).expect("request");
                hyper_get(s.send_request(req)).await
            }
            Stream::H1(s) => {
                let req = http::Request::get(uri.path())
                    .header("host", host)
                    .body(Empty::new())
                    .expect("request");
                hyper_get(s.send_request(req)).await
            }
        }
    }
}

async fn hyper_get(
    sent: impl std::future::Future<Output = hyper::Result<http::Response<hyper::body::Incoming>>>,
) -> bool {
    match sent.await {
        Ok(r) => r.status().is_success() && r.into_body().collect().await.is_ok(),
        Err(_) => false,
    }
}

/// Requests one after another on `stream` until `end`.
async fn requests(mut stream: Stream, uri: http::Uri, host: String, end: Instant) -> Outcome {
    let (mut lat, mut errors) = (Vec::new(), 0);
    while Instant::now() < end {
        let t = Instant::now();
        if stream.get(&uri, &host).await {
            lat.push(t.elapsed().as_micros() as u32);
        } else {
            errors += 1;
        }
    }
    (lat, errors)
}

/// Opens the connections and returns their request streams (and what keeps them open).
async fn open(args: &Args) -> (Vec<Stream>, Vec<Client>) {
    let (mut streams, mut h3) = (Vec::new(), Vec::new());
    if let Proto::H3 = args.proto {
        let bind: SocketAddr = if args.connect.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }
            .parse()
            .expect("addr");
        let config = client_config(roots(&args.ca), false).expect("QUIC client config");
        let ep = endpoint(bind, config).expect("UDP socket");
        for _ in 0..args.connections {
            let c = Client::connect(&ep, args.connect, &args.name, false)
                .await
                .expect("h3 connection");
            streams.extend((0..args.streams).map(|_| Stream::H3(c.sender())));
            h3.push(c);
        }
        return (streams, h3);
    }
    let h2 = matches!(args.proto, Proto::H2);
    let mut tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots(&args.ca))
        .with_no_client_auth();
    tls.alpn_protocols = vec![if h2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    for _ in 0..args.connections {
        let tcp = tokio::net::TcpStream::connect(args.connect).await.expect("TCP connect");
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from(args.name.clone()).expect("server name");
        let io = TokioIo::new(connector.connect(name, tcp).await.expect("TLS handshake"));
        if h2 {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .expect("h2");
            tokio::spawn(conn);
            streams.extend((0..args.streams).map(|_| Stream::H2(send.clone())));
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io).await.expect("h1");
            tokio::spawn(conn);
            streams.push(Stream::H1(send));
        }
    }
    (streams, h3)
}

async fn run(args: &Args) -> (Vec<u32>, u64, f64) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let uri: http::Uri = format!("https://{}{}", args.name, args.path).parse().expect("a path");
    let (streams, _open) = open(args).await;
    let started = Instant::now();
    let end = started + args.duration.get();
    let mut tasks = tokio::task::JoinSet::new();
    for s in streams {
        tasks.spawn(requests(s, uri.clone(), args.name.clone(), end));
    }
    let (mut lat, mut errors) = (Vec::new(), 0);
    while let Some(Ok((l, e))) = tasks.join_next().await {
        lat.extend(l);
        errors += e;
    }
    (lat, errors, started.elapsed().as_secs_f64())
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (lat, errors, secs) = rt.block_on(run(&args));
    let mut lat = lat;
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "{{\"requests\": {}, \"errors\": {errors}, \"req_per_s\": {:.0}, \"p50_ms\": {:.3}, \"p99_ms\": {:.3}}}",
        lat.len(),
        lat.len() as f64 / secs,
        f64::from(pct(0.50)) / 1000.0,
        f64::from(pct(0.99)) / 1000.0
    );
}
