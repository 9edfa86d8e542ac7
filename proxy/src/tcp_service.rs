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
use crate::state::StateError;
use crate::upstream::UpstreamCluster;

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
) -> Result<HashMap<String, Arc<TcpService>>, StateError> {
    let mut out = HashMap::new();
    for l in &config.listeners {
        let Some(t) = &l.tcp else { continue };
        let service = match (t.mode, &config.connect) {
            (TcpMode::Socks5, Some(connect)) => {
                let s = Socks5Listener::new(&l.name, t, connect.clone(), metrics).map_err(|source| {
                    StateError::Socks5 {
                        listener: l.name.clone(),
                        source,
                    }
                })?;
                TcpService::Socks5(s)
            }
            (TcpMode::Socks5, None) => return Err(StateError::Socks5WithoutConnect(l.name.clone())),
            _ => {
                let relay = CompiledTcpListener::new(&l.name, t, |u| upstreams.get(u).cloned(), metrics).ok_or_else(
                    || StateError::UnknownUpstream {
                        route: format!("listener {}", l.name),
                        upstream: "(a tcp route's)".into(),
                    },
                )?;
                TcpService::Relay(relay)
            }
        };
        out.insert(l.name.clone(), Arc::new(service));
    }
    Ok(out)
}
