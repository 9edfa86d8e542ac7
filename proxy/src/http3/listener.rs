//! The QUIC endpoint of one listener: accepts connections within the same connection limits
//! as TCP, completes (or, with 0-RTT, overlaps) the handshake, and serves each connection's
//! request streams until the client goes, the connection idles out, or the proxy drains.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::client_slots::ConnectionSlot;
use crate::forwarding::{ClientInfo, TlsFacts};
use crate::metrics::ClientHandshakeLabels;
use crate::shared::Shared;

/// Binds the listener's UDP socket and starts its QUIC endpoint with `config`.
pub fn bind(address: SocketAddr, config: &quinn::ServerConfig) -> std::io::Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(address)?;
    quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(config.clone()),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
}

/// What every QUIC connection of one listener shares.
struct QuicListener {
    shared: Arc<Shared>,
    name: String,
    handshake_timeout: Duration,
    access_log: Option<Arc<crate::access_log::ListenerLog>>,
}

type Counters = prometheus_client::metrics::family::Family<ClientHandshakeLabels, Counter>;

impl QuicListener {
    fn counter(&self, family: &Counters, kind: &'static str) -> Counter {
        family
            .get_or_create(&ClientHandshakeLabels {
                listener: self.name.clone(),
                kind,
            })
            .clone()
    }

    fn count(&self, kind: &'static str) {
        self.counter(&self.shared.metrics.quic_connections, kind).inc();
    }
}

/// Accepts connections until `stop_accepting`; each connection ends at the drain signal
/// after its requests are done (GOAWAY first).
pub async fn serve(
    listener: &proxyfleet_config::Listener,
    endpoint: quinn::Endpoint,
    shared: Arc<Shared>,
    graceful: Arc<crate::connection_life::Drain>,
    conn_limit: Arc<Semaphore>,
    mut stop_accepting: watch::Receiver<bool>,
) {
    let ctx = Arc::new(QuicListener {
        handshake_timeout: shared.state.load().config.limits.header_read_timeout.get(),
        access_log: crate::access_log::ListenerLog::for_listener(listener, &shared.metrics),
        name: listener.name.clone(),
        shared,
    });
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => match i { Some(i) => i, None => return },
            _ = stop_accepting.changed() => {
                // New connections are refused; open ones keep the endpoint running.
                endpoint.set_server_config(None);
                return;
            }
        };
        let Some(slot) = ctx.slot(&incoming, &conn_limit) else {
            ctx.count("refused");
            incoming.refuse();
            continue;
        };
        tokio::spawn(ctx.clone().connection(incoming, graceful.watcher(), slot));
    }
}

impl QuicListener {
    /// A connection slot within `limits.maxConnections` and the per-client-IP cap.
    fn slot(&self, incoming: &quinn::Incoming, conn_limit: &Arc<Semaphore>) -> Option<ConnectionSlot> {
        let permit = conn_limit.clone().try_acquire_owned().ok()?;
        let ip = incoming.remote_address().ip();
        let ip_slot = match self.shared.state.load().config.limits.max_connections_per_client_ip {
            None => None,
            Some(cap) => Some(self.shared.per_ip.try_take(ip, cap)?),
        };
        Some(ConnectionSlot {
            _permit: permit,
            _ip: ip_slot,
        })
    }

    async fn connection(
        self: Arc<Self>,
        incoming: quinn::Incoming,
        mut drain: watch::Receiver<bool>,
        slot: ConnectionSlot,
    ) {
        let Some((conn, handshake, certs)) = self.handshake(incoming).await else {
            self.count("failed");
            return;
        };
        self.count("accepted");
        let sni = conn
            .handshake_data()
            .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
            .and_then(|d| d.server_name)
            .map(|s| s.to_ascii_lowercase());
        let facts = TlsFacts {
            sni,
            version: "TLSv1.3",
            resumed: false,
            certs,
        };
        let mut client = ClientInfo::new(conn.remote_address(), Some(facts));
        client.access_log = self.access_log.clone();
        client.slot = Some(slot);
        let client = Arc::new(client);
        let max_header = u64::from(self.shared.state.load().config.limits.max_header_bytes);
        let built = h3::server::builder()
            .max_field_section_size(max_header)
            .build::<_, bytes::Bytes>(h3_quinn::Connection::new(conn.clone()))
            .await;
        let Ok(mut h3) = built else { return };
        let early = Arc::new(super::request::EarlyData {
            handshake,
            connection: conn.clone(),
            served: self.counter(&self.shared.metrics.quic_early_requests, "served"),
            waited: self.counter(&self.shared.metrics.quic_early_requests, "waited"),
        });
        let mut requests = JoinSet::new();
        // As HTTP/2's: no request in flight for this long ends the connection (GOAWAY), however
        // often the client PINGs (QUIC's own idle timer counts PINGs as traffic).
        let idle = self.shared.state.load().config.limits.idle_timeout();
        loop {
            tokio::select! {
                accepted = h3.accept() => match accepted {
                    Ok(Some(resolver)) => {
                        let request = super::request::serve(resolver, self.shared.clone(), client.clone(), early.clone());
                        requests.spawn(request);
                    }
                    Ok(None) | Err(_) => break,
                },
                Some(_) = requests.join_next(), if !requests.is_empty() => {}
                _ = tokio::time::sleep(idle), if requests.is_empty() => {
                    let _ = h3.shutdown(0).await;
                    break;
                }
                _ = drain.changed() => {
                    let _ = h3.shutdown(0).await;
                    break;
                }
            }
        }
        while requests.join_next().await.is_some() {}
        conn.close(quinn::VarInt::from_u32(0x100), b""); // H3_NO_ERROR
    }

    /// The handshake, or with 0-RTT its start: requests may arrive before it completes, and
    /// `handshake` says when it has.
    async fn handshake(
        &self,
        incoming: quinn::Incoming,
    ) -> Option<(
        quinn::Connection,
        Option<super::request::Handshake>,
        Arc<crate::tls::SniCertificates>,
    )> {
        let state = self.shared.state.load();
        let (config, certs, zero_rtt) = state.listener_quic.get(&self.name)?.clone();
        drop(state);
        let connecting = incoming.accept_with(config).ok()?;
        let (conn, handshake) = if zero_rtt {
            // A server always gets its connection at once (0.5-RTT); `accepted` resolves when
            // the handshake completes (or the connection is lost).
            let (conn, accepted) = connecting.into_0rtt().ok()?;
            // The rest of the handshake within the same limit as a full one's.
            let (limit, lost) = (self.handshake_timeout, conn.clone());
            let done = async move {
                // (A server's `ZeroRttAccepted` value means nothing; only its completion does.)
                let done = tokio::time::timeout(limit, accepted).await.is_ok();
                if !done {
                    lost.close(quinn::VarInt::from_u32(0x100), b"handshake timeout");
                }
                done
            };
            (conn, Some(done.boxed().shared()))
        } else {
            let conn = tokio::time::timeout(self.handshake_timeout, connecting)
                .await
                .ok()?
                .ok()?;
            (conn, None)
        };
        Some((conn, handshake, certs))
    }
}
