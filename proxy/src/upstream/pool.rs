//! Connections to upstream endpoints: TCP + optional TLS with session resumption; the HTTP/1.1
//! and HTTP/2 pools (`h1pool`, `h2pool`) keep them alive per endpoint.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::metrics::UpstreamMetrics;

pub enum UpstreamStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

pub struct UpstreamConnection {
    stream: UpstreamStream,
    h2: bool,
}

impl UpstreamConnection {
    /// TLS ALPN agreed on h2.
    pub fn negotiated_h2(&self) -> bool {
        self.h2
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
    /// An `auto` endpoint's ALPN answer changed (the server was redeployed): learnt again.
    #[error("{endpoint} now agrees on {now} over ALPN; trying again")]
    Renegotiated { endpoint: String, now: &'static str },
}

/// Dials an endpoint: TCP, and TLS when the upstream has it.
#[derive(Clone)]
pub struct UpstreamConnector {
    pub tls: Option<(Arc<rustls::ClientConfig>, Option<ServerName<'static>>)>,
    pub connect_timeout: Duration,
    pub metrics: UpstreamMetrics,
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
        Ok(TokioIo::new(UpstreamConnection { stream, h2 }))
    }
}
