//! A small HTTP/3 client (quinn + h3) for the `proxyfleet-h3` tool, the tests and the bench.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Request, Response};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("TLS for QUIC: {0}")]
    Tls(String),
    #[error("binding the client's UDP socket: {0}")]
    Bind(#[from] std::io::Error),
    #[error("connecting: {0}")]
    Connect(#[from] quinn::ConnectError),
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    #[error("HTTP/3 connection: {0}")]
    H3(#[from] h3::error::ConnectionError),
    #[error("HTTP/3 stream: {0}")]
    Stream(#[from] h3::error::StreamError),
}

/// A QUIC client config trusting `roots`, offering ALPN h3, sending 0-RTT when `early_data`
/// and it holds a ticket.
pub fn client_config(roots: rustls::RootCertStore, early_data: bool) -> Result<quinn::ClientConfig, ClientError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| ClientError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.enable_early_data = early_data;
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| ClientError::Tls(e.to_string()))?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

/// A client endpoint on an ephemeral UDP port of `bind` (its address family must match the
/// server's).
pub fn endpoint(bind: SocketAddr, config: quinn::ClientConfig) -> Result<quinn::Endpoint, ClientError> {
    let mut endpoint = quinn::Endpoint::client(bind)?;
    endpoint.set_default_client_config(config);
    Ok(endpoint)
}

/// A response read whole.
pub struct Reply {
    pub head: Response<()>,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

/// One HTTP/3 connection.
pub struct Client {
    pub connection: quinn::Connection,
    /// Resolves when the handshake completes, to whether the server took the 0-RTT data; `None`
    /// when the connection did not try 0-RTT.
    pub zero_rtt: Option<quinn::ZeroRttAccepted>,
    send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    driver: tokio::task::JoinHandle<()>,
}

impl Client {
    /// Connects; with `early`, sends requests as 0-RTT data when a ticket allows it.
    pub async fn connect(
        endpoint: &quinn::Endpoint,
        addr: SocketAddr,
        server_name: &str,
        early: bool,
    ) -> Result<Self, ClientError> {
        let connecting = endpoint.connect(addr, server_name)?;
        let (connection, zero_rtt) = match early {
            true => match connecting.into_0rtt() {
                Ok((c, accepted)) => (c, Some(accepted)),
                Err(connecting) => (connecting.await?, None),
            },
            false => (connecting.await?, None),
        };
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(connection.clone())).await?;
        let driver = tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(Self {
            connection,
            zero_rtt,
            send,
            driver,
        })
    }

    /// Sends a request with its body and reads the whole response.
    pub async fn request(&mut self, req: Request<Bytes>) -> Result<Reply, ClientError> {
        self.sender().request(req).await
    }

    /// A handle that sends requests on this connection, concurrently with others.
    pub fn sender(&self) -> Sender {
        Sender(self.send.clone())
    }

    /// Closes the connection (H3_NO_ERROR).
    pub fn close(self) {
        self.connection.close(quinn::VarInt::from_u32(0x100), b"");
        self.driver.abort();
    }
}

/// Sends requests on one connection; clones share it.
#[derive(Clone)]
pub struct Sender(h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>);

impl Sender {
    /// Sends a request with its body and reads the whole response.
    pub async fn request(&mut self, req: Request<Bytes>) -> Result<Reply, ClientError> {
        let (parts, body) = req.into_parts();
        let mut stream = self.0.send_request(Request::from_parts(parts, ())).await?;
        if !body.is_empty() {
            stream.send_data(body).await?;
        }
        stream.finish().await?;
        let head = stream.recv_response().await?;
        let mut data = BytesMut::new();
        while let Some(mut chunk) = stream.recv_data().await? {
            let n = chunk.remaining();
            data.extend_from_slice(&chunk.copy_to_bytes(n));
        }
        let trailers = stream.recv_trailers().await?;
        Ok(Reply {
            head,
            body: data.freeze(),
            trailers,
        })
    }
}
