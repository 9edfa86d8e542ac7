//! A listener's QUIC server configuration: its TLS configuration (same certificates, same
//! client CA, same session tickets) with ALPN `h3`, and the transport limits of `tls.http3`.

use std::sync::Arc;

use proxyfleet_config::Http3;
use quinn::VarInt;

#[derive(Debug, thiserror::Error)]
pub enum QuicConfigError {
    #[error("building the QUIC config of listener {listener}: {message}")]
    Build { listener: String, message: String },
}

/// The QUIC server config for `listener`, from its TCP listener's TLS config.
pub fn quic_server_config(
    listener: &str,
    tls: &rustls::ServerConfig,
    h3: &Http3,
) -> Result<Arc<quinn::ServerConfig>, QuicConfigError> {
    let failed = |message: String| QuicConfigError::Build {
        listener: listener.to_string(),
        message,
    };
    let mut tls = tls.clone();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    // QUIC takes early data whole or not at all (RFC 9001 §4.6.1).
    tls.max_early_data_size = if h3.zero_rtt { u32::MAX } else { 0 };
    if h3.zero_rtt {
        // rustls takes early data only on stateful resumption: each ticket is an entry of the
        // session cache, taken when used, so a ticket opens one 0-RTT connection per pod
        // (RFC 8446 §8.1's single-use tickets), never a replay of it on the same pod.
        tls.ticketer = Arc::new(SessionCacheOnly);
    }
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(Arc::new(tls)).map_err(|e| failed(e.to_string()))?;
    let idle = quinn::IdleTimeout::try_from(h3.idle_timeout()).map_err(|e| failed(e.to_string()))?;
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_idle_timeout(Some(idle))
        .max_concurrent_bidi_streams(VarInt::from_u32(h3.max_concurrent_streams()))
        // The control and the two QPACK streams each way, and a little room.
        .max_concurrent_uni_streams(VarInt::from_u32(8))
        .stream_receive_window(VarInt::from_u32(h3.stream_window_bytes()))
        .receive_window(VarInt::from_u32(h3.connection_window_bytes()));
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    server.transport_config(Arc::new(transport)).migration(true);
    Ok(Arc::new(server))
}

/// No stateless tickets: resumption (and 0-RTT) through the session cache only.
#[derive(Debug)]
struct SessionCacheOnly;

impl rustls::server::ProducesTickets for SessionCacheOnly {
    fn enabled(&self) -> bool {
        false
    }
    fn lifetime(&self) -> u32 {
        0
    }
    fn encrypt(&self, _plain: &[u8]) -> Option<Vec<u8>> {
        None
    }
    fn decrypt(&self, _cipher: &[u8]) -> Option<Vec<u8>> {
        None
    }
}
