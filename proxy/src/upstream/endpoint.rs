//! One upstream endpoint and what the balancer and outlier detection know about it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

/// Milliseconds since the process started: a cheap monotonic clock for atomics.
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Peak-EWMA decay time constant: a latency spike is believed at once and forgotten over ~10 s.
const EWMA_TAU_MS: f64 = 10_000.0;

/// How long P2C shuns an endpoint per gateway failure in a row (a connect failure, a timeout,
/// 502–504), up to `SHUN_MAX`: a shunned endpoint loses every draw against one that is not, so
/// an endpoint that fails fast and is not ejected (the cap of `maxEjectionPercent`, or
/// failures below `consecutiveFailures`) does not draw the traffic its quick failures would
/// win it by latency, whatever the others' load. Once the time is up, one request tries it.
const SHUN_STEP_MS: u64 = 1_000;
const SHUN_MAX_MS: u64 = 30_000;

pub struct Endpoint {
    /// `host:port`, the request URI's authority and the pool key.
    pub authority: http::uri::Authority,
    ewma_us: AtomicU64,
    ewma_stamp_ms: AtomicU64,
    pub in_flight: AtomicU32,
    consecutive_failures: AtomicU32,
    ejected_until_ms: AtomicU64,
    /// Gateway failures in a row (reset by a success), and until when P2C shuns it.
    failure_streak: AtomicU32,
    shunned_until_ms: AtomicU64,
    /// In service as far as health checks go: `passing`, or every endpoint while the cluster
    /// is in panic (`health::publish`).
    pub healthy: AtomicBool,
    /// The health checks' verdict (`health::judge`).
    pub(super) passing: AtomicBool,
    /// Health-check results in a row against `passing`.
    pub(super) health_run: AtomicU32,
    /// Bounds connections (= concurrent requests over HTTP/1.1) to this endpoint.
    pub permits: Semaphore,
    /// Idle connections when the cluster uses its own HTTP/1.1 pool.
    pub(super) h1_idle: super::h1pool::IdleConnections,
    /// Idle connections of our own HTTP/1.1 exchange (`h1relay`); shared with the response
    /// bodies that bring their connection back.
    pub(super) h1_relays: std::sync::Arc<super::h1relay::IdleRelays>,
    /// The connections (one per worker) when the cluster uses its own HTTP/2 pool.
    pub(super) h2: super::h2pool::H2Connection,
    /// For a TLS upstream with `protocol: auto`: what ALPN agreed on with it (`Alpn`).
    pub(super) alpn: std::sync::atomic::AtomicU8,
}

/// What a request or a connection holds of an endpoint for as long as it lives (a request
/// until its response body ends, a TCP pass-through, a WebSocket tunnel): one of its connection
/// permits, counted in flight (P2C's `cost`, so it prefers the endpoint with less open work);
/// both given back on drop, so a request given up mid-wait (its client reset the stream) is
/// never counted for ever.
pub struct EndpointSlot(std::sync::Arc<Endpoint>);

impl EndpointSlot {
    /// A permit of `endpoint` if one is free now (the rule: no timer needed).
    pub fn try_take(endpoint: std::sync::Arc<Endpoint>) -> Option<Self> {
        endpoint.permits.try_acquire().ok()?.forget();
        endpoint.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(Self(endpoint))
    }

    /// Waits for a permit of `endpoint`.
    pub async fn take(endpoint: std::sync::Arc<Endpoint>) -> Option<Self> {
        endpoint.permits.acquire().await.ok()?.forget();
        endpoint.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(Self(endpoint))
    }
}

impl Drop for EndpointSlot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.permits.add_permits(1);
    }
}

/// What an `auto` TLS endpoint speaks, learnt from its first connection's ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Alpn {
    Unknown = 0,
    Http1 = 1,
    H2 = 2,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("authority", &self.authority).finish()
    }
}

impl Endpoint {
    pub fn new(authority: http::uri::Authority, max_connections: u32) -> Self {
        Self {
            authority,
            ewma_us: AtomicU64::new(0f64.to_bits()),
            ewma_stamp_ms: AtomicU64::new(now_ms()),
            in_flight: AtomicU32::new(0),
            consecutive_failures: AtomicU32::new(0),
            ejected_until_ms: AtomicU64::new(0),
            failure_streak: AtomicU32::new(0),
            shunned_until_ms: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            passing: AtomicBool::new(true),
            health_run: AtomicU32::new(0),
            permits: Semaphore::new(max_connections as usize),
            h1_idle: Default::default(),
            h1_relays: Default::default(),
            h2: Default::default(),
            alpn: Default::default(),
        }
    }

    pub fn alpn(&self) -> Alpn {
        match self.alpn.load(Ordering::Relaxed) {
            1 => Alpn::Http1,
            2 => Alpn::H2,
            _ => Alpn::Unknown,
        }
    }

    pub fn learn_alpn(&self, a: Alpn) {
        self.alpn.store(a as u8, Ordering::Relaxed);
    }

    pub fn available(&self, now: u64) -> bool {
        self.healthy.load(Ordering::Relaxed) && self.ejected_until_ms.load(Ordering::Relaxed) <= now
    }

    /// Load estimate used by power-of-two-choices: latency × outstanding requests. The
    /// latency decays since its last sample (as Finagle's peak EWMA does), so an endpoint
    /// that was slow or failed and has been left alone since is tried again in time.
    pub fn cost(&self, now: u64) -> f64 {
        let ewma = f64::from_bits(self.ewma_us.load(Ordering::Relaxed));
        let age = now.saturating_sub(self.ewma_stamp_ms.load(Ordering::Relaxed));
        let decayed = if age == 0 {
            ewma
        } else {
            ewma * (-(age as f64) / EWMA_TAU_MS).exp()
        };
        decayed.max(1.0) * (self.in_flight.load(Ordering::Relaxed) as f64 + 1.0)
    }

    /// A gateway failure: shunned by P2C for `SHUN_STEP_MS` per failure in a row, at most
    /// `SHUN_MAX_MS`.
    pub fn shun(&self) {
        let streak = u64::from(self.failure_streak.fetch_add(1, Ordering::Relaxed)) + 1;
        let until = now_ms() + (streak * SHUN_STEP_MS).min(SHUN_MAX_MS);
        self.shunned_until_ms.store(until, Ordering::Relaxed);
    }

    pub fn is_shunned(&self, now: u64) -> bool {
        self.shunned_until_ms.load(Ordering::Relaxed) > now
    }

    /// Available and not shunned: P2C's first tier.
    fn fine(&self, now: u64) -> bool {
        self.available(now) && !self.is_shunned(now)
    }

    /// Peak EWMA: a slower sample replaces the estimate, faster ones pull it down with decay.
    pub fn observe_latency(&self, latency: Duration) {
        let sample = latency.as_micros() as f64;
        let now = now_ms();
        let prev_stamp = self.ewma_stamp_ms.swap(now, Ordering::Relaxed);
        let prev = f64::from_bits(self.ewma_us.load(Ordering::Relaxed));
        let next = if sample > prev {
            sample
        } else {
            let w = (-((now.saturating_sub(prev_stamp)) as f64) / EWMA_TAU_MS).exp();
            prev * w + sample * (1.0 - w)
        };
        self.ewma_us.store(next.to_bits(), Ordering::Relaxed);
    }

    pub fn record_success(&self) {
        // Read first: the rule is nothing to reset, and a load writes no shared cache line.
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
        if self.failure_streak.load(Ordering::Relaxed) != 0 {
            self.failure_streak.store(0, Ordering::Relaxed);
        }
    }

    /// Counts a 5xx or connect failure; true when it is the `threshold`th in a row (the count
    /// starts again), so the endpoint is due for ejection.
    pub fn failure_reaches(&self, threshold: u32) -> bool {
        if threshold == 0 {
            return false;
        }
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= threshold {
            self.consecutive_failures.store(0, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Skipped by `pick` for `ejection`.
    pub fn eject_for(&self, ejection: Duration) {
        self.ejected_until_ms
            .store(now_ms() + ejection.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn is_ejected(&self, now: u64) -> bool {
        self.ejected_until_ms.load(Ordering::Relaxed) > now
    }

    /// `failure_reaches`, then `eject_for` when it does (tests of `pick`).
    #[cfg(test)]
    pub fn record_failure(&self, threshold: u32, ejection: Duration) -> bool {
        let due = self.failure_reaches(threshold);
        if due {
            self.eject_for(ejection);
        }
        due
    }
}

/// Power of two choices over the endpoints in tiers: those available and not shunned, else
/// those available, else all of them (fail-open: all ejected or unhealthy).
pub fn pick(endpoints: &[std::sync::Arc<Endpoint>]) -> Option<&std::sync::Arc<Endpoint>> {
    match endpoints.len() {
        0 => None,
        1 => endpoints.first(),
        n => {
            let now = now_ms();
            let (a, b) = two_of(n);
            let (ea, eb) = (&endpoints[a], &endpoints[b]);
            if ea.fine(now) && eb.fine(now) {
                return Some(cheaper(ea, eb, now));
            }
            // Some are out: the two drawn again among the best tier left (one drawn beside an
            // ejected or shunned one is not handed the request unweighed).
            p2c_among(endpoints, |e| e.fine(now), now)
                .or_else(|| p2c_among(endpoints, |e| e.available(now), now))
                .or(Some(ea))
        }
    }
}

/// Two distinct indices below `n` (≥ 2), at random.
fn two_of(n: usize) -> (usize, usize) {
    let a = fastrand::usize(..n);
    let mut b = fastrand::usize(..n - 1);
    if b >= a {
        b += 1;
    }
    (a, b)
}

/// The one of `a` and `b` with the lower `cost` (`a` on a tie).
fn cheaper<'a>(
    a: &'a std::sync::Arc<Endpoint>,
    b: &'a std::sync::Arc<Endpoint>,
    now: u64,
) -> &'a std::sync::Arc<Endpoint> {
    if a.cost(now) <= b.cost(now) {
        a
    } else {
        b
    }
}

/// Power of two choices among the endpoints `keep` takes, two distinct ones drawn uniformly
/// (the first of them in the list would otherwise take the share of every one left out
/// before it); None when it takes none. Only runs while some endpoint is out.
fn p2c_among(
    endpoints: &[std::sync::Arc<Endpoint>],
    keep: impl Fn(&Endpoint) -> bool,
    now: u64,
) -> Option<&std::sync::Arc<Endpoint>> {
    let count = endpoints.iter().filter(|e| keep(e)).count();
    let (a, b) = match count {
        0 => return None,
        1 => (0, 0),
        n => two_of(n),
    };
    let (mut first, mut second) = (None, None);
    for (i, e) in endpoints.iter().filter(|e| keep(e)).enumerate() {
        if i == a {
            first = Some(e);
        }
        if i == b {
            second = Some(e);
        }
    }
    match (first, second) {
        (Some(x), Some(y)) => Some(cheaper(x, y, now)),
        // One became available or not between the two passes.
        (x, y) => x.or(y),
    }
}

/// Like `pick`, but never the endpoint `avoid` when another one is available; when none other
/// is, `avoid` again if it is available, else another (fail-open).
pub fn pick_avoiding<'a>(
    endpoints: &'a [std::sync::Arc<Endpoint>],
    avoid: Option<&http::uri::Authority>,
) -> Option<&'a std::sync::Arc<Endpoint>> {
    let Some(avoid) = avoid else { return pick(endpoints) };
    if endpoints.len() < 2 {
        return endpoints.first();
    }
    let now = now_ms();
    p2c_among(endpoints, |e| &e.authority != avoid && e.fine(now), now)
        .or_else(|| p2c_among(endpoints, |e| &e.authority != avoid && e.available(now), now))
        .or_else(|| {
            endpoints
                .iter()
                .find(|e| &e.authority == avoid && e.available(now))
                .or_else(|| endpoints.iter().find(|e| &e.authority != avoid))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn ep(port: u16) -> Arc<Endpoint> {
        Arc::new(Endpoint::new(format!("127.0.0.1:{port}").parse().unwrap(), 10))
    }

    #[test]
    fn prefers_the_faster_endpoint() {
        let eps = vec![ep(1), ep(2)];
        eps[0].observe_latency(Duration::from_millis(50));
        eps[1].observe_latency(Duration::from_millis(1));
        for _ in 0..50 {
            assert_eq!(pick(&eps).unwrap().authority.port_u16(), Some(2));
        }
    }

    #[test]
    fn ejects_after_consecutive_failures_and_skips() {
        let eps = vec![ep(1), ep(2)];
        assert!(!eps[0].record_failure(3, Duration::from_secs(60)));
        assert!(!eps[0].record_failure(3, Duration::from_secs(60)));
        assert!(eps[0].record_failure(3, Duration::from_secs(60)));
        for _ in 0..50 {
            assert_eq!(pick(&eps).unwrap().authority.port_u16(), Some(2));
        }
    }

    #[test]
    fn success_resets_the_failure_streak() {
        let e = ep(1);
        e.record_failure(2, Duration::from_secs(60));
        e.record_success();
        assert!(!e.record_failure(2, Duration::from_secs(60)));
    }

    #[test]
    fn fails_open_when_everything_is_ejected() {
        let eps = vec![ep(1), ep(2)];
        eps[0].record_failure(1, Duration::from_secs(60));
        eps[1].record_failure(1, Duration::from_secs(60));
        assert!(pick(&eps).is_some());
    }

    #[test]
    fn the_endpoints_left_share_the_traffic_of_those_ejected() {
        // Ten endpoints, the first eight ejected: the two left get about half each, not the
        // first of them the share of every ejected one before it.
        let eps: Vec<_> = (1..=10).map(ep).collect();
        for e in &eps[..8] {
            e.record_failure(1, Duration::from_secs(60));
        }
        let picks = (0..4000)
            .filter(|_| pick(&eps).unwrap().authority.port_u16() == Some(9))
            .count();
        assert!((1600..=2400).contains(&picks), "endpoint 9 got {picks} of 4000");
    }

    #[test]
    fn a_retry_goes_back_to_the_only_available_endpoint_not_to_an_ejected_one() {
        let eps = vec![ep(1), ep(2)];
        eps[1].record_failure(1, Duration::from_secs(60));
        let avoid = eps[0].authority.clone();
        assert_eq!(pick_avoiding(&eps, Some(&avoid)).unwrap().authority, avoid);
        eps[0].record_failure(1, Duration::from_secs(60));
        assert_eq!(
            pick_avoiding(&eps, Some(&avoid)).unwrap().authority,
            eps[1].authority,
            "all ejected: another one (fail-open)"
        );
    }

    #[test]
    fn an_endpoint_that_fails_fast_is_shunned_whatever_the_others_load() {
        let eps: Vec<_> = (1..=2).map(ep).collect();
        // The other is slow and busy; a refused connection is the fastest answer there is.
        eps[1].observe_latency(Duration::from_millis(500));
        eps[1].in_flight.store(1000, Ordering::Relaxed);
        eps[0].shun();
        for _ in 0..100 {
            assert_eq!(pick(&eps).unwrap().authority, eps[1].authority);
        }
        let now = now_ms();
        assert!(!eps[0].is_shunned(now + 1_001), "one failure: a second");
        eps[0].shun();
        eps[0].shun();
        assert!(eps[0].is_shunned(now + 2_500), "three in a row: three seconds");
        eps[0].record_success();
        eps[0].shun();
        assert!(!eps[0].is_shunned(now + 1_500), "a success starts the streak again");
    }

    #[test]
    fn a_slow_estimate_decays_unsampled() {
        let e = ep(1);
        e.observe_latency(Duration::from_secs(1));
        let now = now_ms();
        assert!(e.cost(now + 60_000) < e.cost(now) / 100.0);
    }

    #[test]
    fn an_ejected_endpoint_drawn_hands_its_turn_to_a_weighed_pair() {
        // e0 ejected, e1 failing (penalized, not ejected: the cap), e2 fine: a draw of
        // (e0, e1) must not hand e1 the request unweighed.
        let eps: Vec<_> = (1..=3).map(ep).collect();
        eps[0].record_failure(1, Duration::from_secs(60));
        eps[1].shun();
        eps[2].observe_latency(Duration::from_millis(2));
        for _ in 0..200 {
            assert_eq!(pick(&eps).unwrap().authority, eps[2].authority);
        }
    }

    #[test]
    fn a_request_given_up_mid_wait_leaves_no_load_behind() {
        let e = Arc::new(Endpoint::new("127.0.0.1:1".parse().unwrap(), 1));
        let waiting = EndpointSlot::try_take(e.clone()).unwrap();
        assert_eq!(e.in_flight.load(Ordering::Relaxed), 1);
        assert!(EndpointSlot::try_take(e.clone()).is_none(), "one permit");
        drop(waiting); // what dropping the attempt's future does, at any await
        assert_eq!(e.in_flight.load(Ordering::Relaxed), 0);
        assert!(EndpointSlot::try_take(e.clone()).is_some(), "the permit is back");
    }
}
