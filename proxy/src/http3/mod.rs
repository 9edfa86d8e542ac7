//! HTTP/3 over QUIC (quinn, h3): a UDP endpoint beside a TLS listener, on the same port
//! number, serving the same routes through the same request path (`handler::handle`).
//!
//! Reading order: `listener` (endpoint, connections, 0-RTT) → `request` (one request stream)
//! → `body` (the request body as the request path reads it) → `config` (QUIC settings).

mod body;
pub mod client;
mod config;
mod listener;
mod request;

pub use body::H3Body;
pub use config::{quic_server_config, QuicConfigError};
pub use listener::{bind, serve};
