//! What a TCP listener does with a connection: relay it (TLS passthrough, plain TCP) or speak
//! SOCKS5 first. Built per listener on every reload.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;

use proxyfleet_config::{ProxyConfig, TcpMode};

use crate::metrics::Metrics;
use crate::passthrough::CompiledTcpListener;
use crate::socks5::Socks5Listener;
use crate::upstream::UpstreamCluster;

/// A TCP listener that cannot be built from a validated configuration.
#[derive(Debug, thiserror::Error)]
pub enum TcpServiceError {
    #[error("listener {listener}: {source}")]
    Socks5 {
        listener: String,
        source: crate::socks5::CredentialsError,
    },
    #[error("listener {0}: mode socks5 needs connect (its allow-list)")]
    Socks5WithoutConnect(String),
    #[error("listener {0}: a tcp route names an unknown upstream")]
    UnknownUpstream(String),
}

pub enum TcpService {
    Relay(CompiledTcpListener),
    Socks5(Socks5Listener),
}

impl TcpService {
    /// Serves one client connection to its end.
    pub async fn serve(&self, stream: TcpStream, remote: SocketAddr, local: SocketAddr) {
        match self {
            TcpService::Relay(l) => crate::passthrough::serve(l, stream, remote, local).await,
            TcpService::Socks5(l) => crate::socks5::serve(l, stream, remote).await,
        }
    }
}

/// Each TCP listener's service, resolved against the upstreams (validated beforehand).
pub fn build(
    config: &ProxyConfig,
    upstreams: &HashMap<String, Arc<UpstreamCluster>>,
    metrics: &Metrics,
) -> Result<HashMap<String, Arc<TcpService>>, TcpServiceError> {
    let mut out = HashMap::new();
    for l in &config.listeners {
        let Some(t) = &l.tcp else { continue };
        let service = match (t.mode, &config.connect) {
            (TcpMode::Socks5, Some(connect)) => {
                let s = Socks5Listener::new(&l.name, t, connect.clone(), metrics).map_err(|source| {
                    TcpServiceError::Socks5 {
                        listener: l.name.clone(),
                        source,
                    }
                })?;
                TcpService::Socks5(s)
            }
            (TcpMode::Socks5, None) => return Err(TcpServiceError::Socks5WithoutConnect(l.name.clone())),
            _ => {
                let relay = CompiledTcpListener::new(&l.name, t, |u| upstreams.get(u).cloned(), metrics)
                    .ok_or_else(|| TcpServiceError::UnknownUpstream(l.name.clone()))?;
                TcpService::Relay(relay)
            }
        };
        out.insert(l.name.clone(), Arc::new(service));
    }
    Ok(out)
}
