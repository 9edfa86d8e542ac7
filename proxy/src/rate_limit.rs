//! Local rate limiting: token buckets per route, optionally one per client IP or per header
//! value. Only routes that ask for it pay for it (one short lock per request).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::header::HeaderName;
use http::HeaderMap;

use proxyfleet_config::RateLimit;

/// Keyed buckets kept at most; beyond it, full (idle) buckets are dropped first, then all.
const MAX_KEYS: usize = 65_536;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Takes one token, or says how long until one is there.
    fn take(&mut self, rate: f64, burst: f64, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        // Capped as every duration is (10⁹ s): a tiny rate must not overflow a Duration.
        Err(Duration::from_secs_f64(
            ((1.0 - self.tokens) / rate).clamp(0.0, proxyfleet_config::MAX_DURATION_SECS),
        ))
    }

    fn full(&self, rate: f64, burst: f64, now: Instant) -> bool {
        self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * rate >= burst
    }
}

enum Key {
    Route,
    ClientIp,
    Header(HeaderName),
}

pub struct RateLimiter {
    rate: f64,
    burst: f64,
    key: Key,
    /// By key: the client's address, or a keyed hash of the header's value, so a bucket costs
    /// the same whatever a client sends (a 64 KiB header value is not kept 65 536 times).
    buckets: Mutex<HashMap<u128, Bucket>>,
    hasher: std::hash::RandomState,
}

impl RateLimiter {
    pub fn new(config: &RateLimit) -> Self {
        let burst = config
            .burst
            .map_or(config.requests_per_second.ceil().max(1.0), f64::from);
        let key = match (&config.per_header, config.per_client_ip) {
            (Some(h), _) => HeaderName::from_bytes(h.as_bytes()).map_or(Key::Route, Key::Header),
            (None, true) => Key::ClientIp,
            (None, false) => Key::Route,
        };
        Self {
            rate: config.requests_per_second,
            burst,
            key,
            buckets: Mutex::new(HashMap::new()),
            hasher: std::hash::RandomState::new(),
        }
    }

    /// Admits one request now, or returns how long the client should wait.
    pub fn check(&self, headers: &HeaderMap, client: IpAddr, now: Instant) -> Result<(), Duration> {
        let key: u128 = match &self.key {
            Key::Route => 0,
            Key::ClientIp => match client {
                IpAddr::V4(a) => u128::from(a.to_ipv6_mapped()),
                IpAddr::V6(a) => u128::from(a),
            },
            Key::Header(h) => headers.get(h).map_or(0, |v| {
                u128::from(std::hash::BuildHasher::hash_one(&self.hasher, v.as_bytes()))
            }),
        };
        let Ok(mut buckets) = self.buckets.lock() else {
            return Ok(()); // a poisoned lock must not turn into an outage
        };
        if buckets.len() >= MAX_KEYS && !buckets.contains_key(&key) {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, b| !b.full(rate, burst, now));
            if buckets.len() >= MAX_KEYS {
                buckets.clear();
            }
        }
        let burst = self.burst;
        buckets
            .entry(key)
            .or_insert(Bucket { tokens: burst, at: now })
            .take(self.rate, burst, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(yaml: &str) -> RateLimiter {
        RateLimiter::new(&serde_yaml::from_str(yaml).unwrap())
    }

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let l = limiter("{requestsPerSecond: 10, burst: 5}");
        let (h, ip, t0) = (HeaderMap::new(), IpAddr::from([10, 0, 0, 1]), Instant::now());
        assert!((0..5).all(|_| l.check(&h, ip, t0).is_ok()));
        let wait = l.check(&h, ip, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        assert!(l.check(&h, ip, t0 + Duration::from_millis(100)).is_ok());
        assert!(l.check(&h, ip, t0 + Duration::from_millis(100)).is_err());
        // Refill stops at the burst.
        let later = t0 + Duration::from_secs(60);
        assert!((0..5).all(|_| l.check(&h, ip, later).is_ok()));
        assert!(l.check(&h, ip, later).is_err());
    }

    #[test]
    fn keys_get_their_own_buckets() {
        let l = limiter("{requestsPerSecond: 1, burst: 1, perClientIp: true}");
        let (h, t0) = (HeaderMap::new(), Instant::now());
        assert!(l.check(&h, IpAddr::from([10, 0, 0, 1]), t0).is_ok());
        assert!(l.check(&h, IpAddr::from([10, 0, 0, 1]), t0).is_err());
        assert!(l.check(&h, IpAddr::from([10, 0, 0, 2]), t0).is_ok());
        let l = limiter("{requestsPerSecond: 1, burst: 1, perHeader: x-api-key}");
        let mut a = HeaderMap::new();
        a.insert("x-api-key", "a".parse().unwrap());
        let mut b = HeaderMap::new();
        b.insert("x-api-key", "b".parse().unwrap());
        let ip = IpAddr::from([10, 0, 0, 1]);
        assert!(l.check(&a, ip, t0).is_ok() && l.check(&b, ip, t0).is_ok());
        assert!(l.check(&a, ip, t0).is_err());
    }

    #[test]
    fn the_default_burst_is_one_seconds_worth() {
        let l = limiter("{requestsPerSecond: 2.5}");
        let (h, ip, t0) = (HeaderMap::new(), IpAddr::from([10, 0, 0, 1]), Instant::now());
        assert_eq!((0..10).filter(|_| l.check(&h, ip, t0).is_ok()).count(), 3);
    }

    #[test]
    fn a_rate_too_small_to_wait_for_is_a_capped_wait_not_a_panic() {
        // Validation refuses it; the limiter must not abort the process if one slips through.
        let l = limiter("{requestsPerSecond: 1e-20, burst: 1}");
        let (h, ip, t0) = (HeaderMap::new(), IpAddr::from([10, 0, 0, 1]), Instant::now());
        assert!(l.check(&h, ip, t0).is_ok());
        assert_eq!(l.check(&h, ip, t0), Err(Duration::from_secs(1_000_000_000)));
    }

    #[test]
    fn an_ipv4_client_and_its_mapped_ipv6_address_share_a_bucket() {
        let l = limiter("{requestsPerSecond: 1, burst: 1, perClientIp: true}");
        let (h, t0) = (HeaderMap::new(), Instant::now());
        assert!(l.check(&h, IpAddr::from([10, 0, 0, 1]), t0).is_ok());
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert!(l.check(&h, mapped, t0).is_err());
    }
}
