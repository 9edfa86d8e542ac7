//! Active HTTP health checks: every endpoint is probed each `interval`, all at once (a probe
//! waiting out its timeout delays no other endpoint's), and its state changes only after
//! `unhealthyThreshold` failed or `healthyThreshold` passed probes in a row, as HAProxy's
//! `fall` and `rise`, so one lost probe does not take an endpoint out. When fewer than
//! `panicThreshold` percent of the endpoints pass, all of them stay in service (Envoy's panic
//! mode): the checks are more likely wrong than most of the endpoints down, and the few left
//! would take a load they were not sized for.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use proxyfleet_config::HealthCheck;

use super::{Endpoint, UpstreamCluster};
use crate::body::UpstreamBody;

/// An endpoint's standing: healthy or not, and its run of probe results against that
/// (failures while healthy, passes while not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    pub healthy: bool,
    pub against: u32,
}

/// The standing after a probe that `passed`, with the thresholds (`fall`, `rise`).
pub fn judge(now: Standing, passed: bool, fall: u32, rise: u32) -> Standing {
    if passed == now.healthy {
        return Standing {
            healthy: now.healthy,
            against: 0,
        };
    }
    let against = now.against + 1;
    let needed = if now.healthy { fall } else { rise };
    if against >= needed {
        Standing {
            healthy: passed,
            against: 0,
        }
    } else {
        Standing {
            healthy: now.healthy,
            against,
        }
    }
}

/// Probes the cluster's endpoints until the cluster is dropped or retired, the first time one
/// interval after it was built: a cluster built by a reload that is then refused is dropped
/// before it probes, so it never judges endpoints it shares with the running one (endpoints
/// start in, and an adopted one keeps its standing).
pub async fn check_until_dropped(cluster: Weak<UpstreamCluster>) {
    loop {
        let Some(interval) = cluster
            .upgrade()
            .and_then(|c| c.config.health_check.as_ref().map(|h| h.interval.get()))
        else {
            return;
        };
        tokio::time::sleep(interval).await;
        let Some(c) = cluster.upgrade().filter(|c| !c.superseded()) else {
            return;
        };
        let Some(hc) = c.config.health_check.clone() else {
            return;
        };
        let endpoints = c.endpoints.load_full();
        futures_util::future::join_all(endpoints.iter().map(|e| probe_and_judge(&c, &hc, e))).await;
        // A round a reload overtook is its successor's to judge (shared endpoints, one gauge).
        if c.superseded() {
            return;
        }
        publish(&c, &endpoints, hc.panic_threshold());
    }
}

async fn probe_and_judge(c: &UpstreamCluster, hc: &HealthCheck, e: &Arc<Endpoint>) {
    let Some(passed) = probe(c, hc, e).await.filter(|_| !c.superseded()) else {
        return;
    };
    let now = Standing {
        healthy: e.passing.load(Ordering::Relaxed),
        against: e.health_run.load(Ordering::Relaxed),
    };
    let (fall, rise) = hc.thresholds();
    let next = judge(now, passed, fall, rise);
    e.health_run.store(next.against, Ordering::Relaxed);
    if next.healthy != now.healthy {
        e.passing.store(next.healthy, Ordering::Relaxed);
        tracing::warn!(upstream = %c.name, endpoint = %e.authority, healthy = next.healthy, "health check changed");
    }
}

/// Whether a cluster of `total` endpoints of which `passing` pass is in panic: fewer than
/// `threshold` percent of them pass.
pub fn panics(passing: usize, total: usize, threshold: u32) -> bool {
    (passing as u64) * 100 < u64::from(threshold) * total as u64
}

/// The verdicts put in service: each endpoint's own, or, in panic, every endpoint.
fn publish(c: &UpstreamCluster, endpoints: &[Arc<Endpoint>], threshold: u32) {
    let passing = endpoints.iter().filter(|e| e.passing.load(Ordering::Relaxed)).count();
    let panic = panics(passing, endpoints.len(), threshold);
    for e in endpoints {
        let healthy = panic || e.passing.load(Ordering::Relaxed);
        if e.healthy.load(Ordering::Relaxed) != healthy {
            e.healthy.store(healthy, Ordering::Relaxed);
        }
    }
    if c.metrics.healthy_panic.set(i64::from(panic)) != i64::from(panic) {
        tracing::warn!(upstream = %c.name, passing, endpoints = endpoints.len(), threshold, panic,
            "health checks: below the panic threshold every endpoint is used");
    }
}

/// One GET of the check's path: whether it answered 2xx within the timeout; None when no
/// request can be made for it.
async fn probe(c: &UpstreamCluster, hc: &HealthCheck, e: &Arc<Endpoint>) -> Option<bool> {
    let pq = http::uri::PathAndQuery::try_from(hc.path.as_str()).ok()?;
    let uri = c.request_uri(&e.authority, pq).ok()?;
    let mut req = http::Request::new(UpstreamBody::Empty);
    *req.uri_mut() = uri;
    if let Ok(host) = http::HeaderValue::from_str(e.authority.as_str()) {
        req.headers_mut().insert(http::header::HOST, host);
    }
    Some(matches!(
        tokio::time::timeout(hc.timeout.get(), c.send(e, req)).await,
        Ok(Ok((resp, _))) if resp.status().is_success()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start_healthy: bool, probes: &[bool], fall: u32, rise: u32) -> Vec<bool> {
        let mut s = Standing {
            healthy: start_healthy,
            against: 0,
        };
        probes
            .iter()
            .map(|p| {
                s = judge(s, *p, fall, rise);
                s.healthy
            })
            .collect()
    }

    #[test]
    fn panic_is_fewer_than_the_threshold_passing() {
        assert!(!panics(1, 2, 50), "half is not fewer than half");
        assert!(panics(1, 3, 50));
        assert!(!panics(2, 3, 50));
        assert!(panics(0, 1, 50));
        assert!(!panics(0, 3, 0), "0 turns it off");
        assert!(panics(99, 100, 100), "100: any failing endpoint");
        assert!(!panics(0, 0, 50), "no endpoints, no panic");
    }

    #[test]
    fn one_lost_probe_takes_nothing_out() {
        assert_eq!(run(true, &[false, true, false, false, true], 3, 2), [true; 5]);
    }

    #[test]
    fn fall_failures_in_a_row_take_it_out_and_rise_passes_bring_it_back() {
        let seen = run(true, &[false, false, false, true, false, true, true], 3, 2);
        assert_eq!(seen, [true, true, false, false, false, false, true]);
    }

    #[test]
    fn thresholds_of_one_follow_every_probe() {
        assert_eq!(run(true, &[false, true, false], 1, 1), [false, true, false]);
    }
}
