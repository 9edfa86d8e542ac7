//! Outlier detection's ejections: an endpoint that fails `consecutiveFailures` times in a row
//! is skipped for `ejectionTime`, while at most `maxEjectionPercent` of the upstream's
//! endpoints are (one always may be), as Envoy's outlier detection does.

use super::{now_ms, Endpoint, UpstreamCluster};

/// Whether one more of `total` endpoints may be ejected while `ejected` are: the share ejected
/// after it stays within `max_percent`, or none is ejected yet.
pub fn may_eject(ejected: usize, total: usize, max_percent: u32) -> bool {
    ejected == 0 || (ejected + 1) * 100 <= total * max_percent as usize
}

impl UpstreamCluster {
    /// Counts a failure of `endpoint` (a 5xx, a connect failure, a timeout): a `gateway` one
    /// (not an application's 500) makes P2C shun it for a while (`Endpoint::shun`); every one
    /// counts towards its ejection, made when it is due and the cap allows (counted and logged).
    pub fn record_failure(&self, endpoint: &Endpoint, gateway: bool) {
        if gateway {
            endpoint.shun();
        }
        let od = &self.config.outlier_detection;
        if !endpoint.failure_reaches(od.consecutive_failures) {
            return;
        }
        // Poisoned only by a panic elsewhere while held, which nothing here can do.
        let _held = self.ejecting.lock().unwrap_or_else(|p| p.into_inner());
        let endpoints = self.endpoints.load();
        let now = now_ms();
        let ejected = endpoints
            .iter()
            .filter(|e| e.authority != endpoint.authority && e.is_ejected(now))
            .count();
        if !may_eject(ejected, endpoints.len(), od.max_ejection_percent()) {
            tracing::debug!(upstream = %self.name, endpoint = %endpoint.authority, ejected, "endpoint failing but kept: outlierDetection.maxEjectionPercent reached");
            return;
        }
        endpoint.eject_for(od.ejection_time.get());
        self.metrics.ejections.inc();
        tracing::warn!(upstream = %self.name, endpoint = %endpoint.authority, "endpoint ejected after consecutive failures");
    }
}

#[cfg(test)]
mod tests {
    use super::may_eject;

    #[test]
    fn one_endpoint_may_always_be_ejected() {
        assert!(may_eject(0, 1, 10));
        assert!(may_eject(0, 3, 0));
        assert!(!may_eject(1, 3, 10), "a second of three is 67 %");
    }

    #[test]
    fn the_share_ejected_stays_within_the_cap() {
        // Twenty endpoints at 10 %: two.
        assert!(may_eject(1, 20, 10));
        assert!(!may_eject(2, 20, 10));
        // At 100 %: every one of them.
        assert!(may_eject(19, 20, 100));
        assert!(may_eject(2, 3, 100));
        // At 50 % of four: two.
        assert!(may_eject(1, 4, 50));
        assert!(!may_eject(2, 4, 50));
    }
}
