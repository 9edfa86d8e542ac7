//! What every connection and request shares: the current state (swapped whole on reload),
//! metrics, readiness and session-resumption stores. At the bottom of the module graph.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::metrics::{Metrics, RouteMetrics};
use crate::state::ProxyState;
use crate::tls::ServerResumption;

/// What every connection and request shares.
pub struct Shared {
    pub state: ArcSwap<ProxyState>,
    pub metrics: Metrics,
    /// False from SIGTERM on: /readyz fails so endpoints are removed before we stop accepting.
    pub ready: AtomicBool,
    pub resumption: HashMap<String, Arc<ServerResumption>>,
    pub config_path: Option<PathBuf>,
    pub no_route_metrics: RouteMetrics,
    /// The latest live weights per route (`live_weights`); written only when weights change.
    pub live_weights: std::sync::Mutex<HashMap<String, proxyfleet_config::LiveWeights>>,
    /// ACME HTTP-01 challenges pushed by the operator.
    pub acme: crate::acme::AcmeAnswers,
    /// Open client connections per IP, for `limits.maxConnectionsPerClientIp`.
    pub per_ip: Arc<crate::client_slots::PerIpConnections>,
}
