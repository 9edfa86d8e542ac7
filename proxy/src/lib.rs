//! proxyfleet-proxy: a pooled-TLS reverse proxy.
//!
//! Reading order: `server` (process, listeners, drain) → `handler` (the request phases) →
//! `router` → `upstream` (balancer, pool) → `tls` → `state` / `reload` → `metrics` / `admin`.

// Errors here are built at start-up and on reload only, never on the request path; their size
// does not matter.
#![allow(clippy::result_large_err)]

pub mod access_log;
pub mod acme;
pub mod admin;
pub mod body;
pub mod body_watch;
pub mod client_slots;
pub mod config_file;
pub mod connect;
pub mod connection_life;
pub mod cors;
pub mod cpu_quota;
mod first_byte;
mod forwarding;
pub mod grpc;
pub mod handler;
pub mod http3;
pub mod http_rules;
pub mod idle_spin;
pub mod jwt;
pub mod live_weights;
pub mod metrics;
pub mod mirror;
pub mod ocsp;
pub mod passthrough;
pub mod rate_limit;
mod redirect;
pub mod relay;
pub mod reload;
pub mod request_path;
pub mod route_auth;
pub mod router;
pub mod send_timeout;
pub mod server;
pub mod shared;
pub mod socks5;
pub mod split;
mod stall;
pub mod state;
pub mod tcp_service;
pub mod tls;
pub mod trace_context;
pub mod transcode;
pub mod tunnel_target;
pub mod upgrade;
pub mod upstream;
pub mod workers;

pub use config_file::read_config;
pub use server::{run, start, RunningProxy};
