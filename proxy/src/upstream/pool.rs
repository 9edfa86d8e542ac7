//! Connections to upstream endpoints: TCP + optional TLS with session resumption, kept alive
//! and reused by hyper-util's pool (one pool per upstream cluster, keyed by endpoint).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::metrics::UpstreamMetrics;

/// Marks whether a connection has carried a request yet; put into every response's
/// extensions so the first request on a connection is counted as "new", the rest "reused".
#[derive(Clone, Debug)]
pub struct ConnectionFreshness(pub Arc<AtomicBool>);

impl ConnectionFreshness {
    /// True exactly once per connection.
    pub fn take_fresh(&self) -> bool {
        self.0.swap(false, Ordering::Relaxed)
    }
}

pub enum UpstreamStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

pub struct UpstreamConnection {
    stream: UpstreamStream,
    h2: bool,
    fresh: ConnectionFreshness,
}

impl Connection for UpstreamConnection {
    fn connected(&self) -> Connected {
        let c = Connected::new().extra(self.fresh.clone());
        if self.h2 {
            c.negotiated_h2()
        } else {
            c
        }
    }
}

impl AsyncRead for UpstreamConnection {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().stream {
            UpstreamStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamConnection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().stream {
            UpstreamStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().stream {
            UpstreamStream::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().stream {
            UpstreamStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().stream {
            UpstreamStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            UpstreamStream::Plain(s) => s.is_write_vectored(),
            UpstreamStream::Tls(s) => s.is_write_vectored(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connecting to {endpoint}: timed out after {timeout:?}")]
    Timeout { endpoint: String, timeout: Duration },
    #[error("connecting to {endpoint}: {source}")]
    Io { endpoint: String, source: std::io::Error },
    #[error("TLS handshake with {endpoint}: {source}")]
    Tls { endpoint: String, source: std::io::Error },
    #[error("invalid TLS server name {0:?}")]
    ServerName(String),
}

/// The connector handed to hyper-util's client: it dials the URI's authority.
#[derive(Clone)]
pub struct UpstreamConnector {
    pub tls: Option<(Arc<rustls::ClientConfig>, Option<ServerName<'static>>)>,
    pub connect_timeout: Duration,
    pub metrics: UpstreamMetrics,
}

impl tower_service::Service<http::Uri> for UpstreamConnector {
    type Response = TokioIo<UpstreamConnection>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let Some(endpoint) = uri.authority().cloned() else {
                return Err(ConnectError::ServerName(uri.to_string()));
            };
            this.dial(&endpoint).await
        })
    }
}

impl UpstreamConnector {
    /// TCP (+ TLS) to `endpoint`, counted in the connect metrics.
    pub async fn dial(&self, endpoint: &http::uri::Authority) -> Result<TokioIo<UpstreamConnection>, ConnectError> {
        let result = self.connect(endpoint).await;
        match &result {
            Ok(_) => self.metrics.connect_ok.inc(),
            Err(_) => self.metrics.connect_error.inc(),
        };
        result
    }

    async fn connect(&self, authority: &http::uri::Authority) -> Result<TokioIo<UpstreamConnection>, ConnectError> {
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = authority.port_u16().unwrap_or(80);
        let endpoint = format!("{host}:{port}");
        let tcp = tokio::time::timeout(self.connect_timeout, TcpStream::connect((host.as_str(), port)))
            .await
            .map_err(|_| ConnectError::Timeout {
                endpoint: endpoint.clone(),
                timeout: self.connect_timeout,
            })?
            .map_err(|source| ConnectError::Io {
                endpoint: endpoint.clone(),
                source,
            })?;
        let _ = tcp.set_nodelay(true);
        let fresh = ConnectionFreshness(Arc::new(AtomicBool::new(true)));
        let (stream, h2) = match &self.tls {
            None => (UpstreamStream::Plain(tcp), false),
            Some((config, server_name)) => {
                let name = match server_name {
                    Some(n) => n.clone(),
                    None => ServerName::try_from(host.clone()).map_err(|_| ConnectError::ServerName(host.clone()))?,
                };
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                let tls = tokio::time::timeout(self.connect_timeout, connector.connect(name, tcp))
                    .await
                    .map_err(|_| ConnectError::Timeout {
                        endpoint: endpoint.clone(),
                        timeout: self.connect_timeout,
                    })?
                    .map_err(|source| ConnectError::Tls {
                        endpoint: endpoint.clone(),
                        source,
                    })?;
                let (_, session) = tls.get_ref();
                match session.handshake_kind() {
                    Some(rustls::HandshakeKind::Resumed) => self.metrics.handshake_resumed.inc(),
                    _ => self.metrics.handshake_full.inc(),
                };
                let h2 = session.alpn_protocol() == Some(b"h2");
                (UpstreamStream::Tls(Box::new(tls)), h2)
            }
        };
        Ok(TokioIo::new(UpstreamConnection { stream, h2, fresh }))
    }
}
