//! Choosing a route's backend per request: forced overrides first, then the sticky bucket of a
//! user key, then an exact weighted rotation. Weights live in a table swapped whole when live
//! weights arrive, so the request path takes one atomic load and no lock.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

use proxyfleet_config::{bucket_of, Backend, BackendOverride, LiveWeights, Route, StickyKey, BUCKETS};

use crate::metrics::RouteMetrics;
use crate::upstream::UpstreamCluster;

/// One upstream of a route, with the route's metrics labelled by that upstream.
pub struct CompiledBackend {
    pub upstream: Arc<UpstreamCluster>,
    pub metrics: RouteMetrics,
}

/// Where a key is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    Header(HeaderName),
    Cookie(String),
}

impl KeySource {
    fn parse(header: Option<&str>, cookie: Option<&str>) -> Option<Self> {
        match (header, cookie) {
            (Some(h), _) => HeaderName::from_bytes(h.as_bytes()).ok().map(Self::Header),
            (None, Some(c)) => Some(Self::Cookie(c.to_string())),
            (None, None) => None,
        }
    }

    /// The key's value in a request, if present.
    pub fn value<'a>(&self, headers: &'a HeaderMap) -> Option<&'a [u8]> {
        match self {
            Self::Header(name) => headers.get(name).map(HeaderValue::as_bytes),
            Self::Cookie(name) => cookie_value(headers, name),
        }
    }
}

/// A cookie's value from the request's Cookie headers (`a=1; b=2`, possibly several headers).
pub fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    headers.get_all(http::header::COOKIE).iter().find_map(|h| {
        h.as_bytes().split(|b| *b == b';').find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|b| *b == b'=')?;
            (&pair[..eq] == name.as_bytes()).then(|| &pair[eq + 1..])
        })
    })
}

/// The weights in force: which backend owns each of the 100 buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// Generation of the live weights applied (0: the configured weights).
    pub generation: u64,
    /// Weight of each backend, in the route's order.
    pub weights: Vec<u8>,
    /// Whether forced routing applies.
    pub overrides: bool,
    by_bucket: [u8; BUCKETS as usize],
}

impl Table {
    /// Buckets handed out in backend order: the first backend owns [0, w0), the next the
    /// following w1 buckets, and so on. So a backend's users stay on it while its weight (and
    /// the weights before it) only grow.
    pub fn new(generation: u64, weights: Vec<u8>, overrides: bool) -> Self {
        let mut by_bucket = [0u8; BUCKETS as usize];
        let mut next = 0usize;
        for (i, w) in weights.iter().enumerate() {
            for slot in by_bucket.iter_mut().skip(next).take(usize::from(*w)) {
                *slot = i as u8;
            }
            next += usize::from(*w);
        }
        // Weights are validated to sum to 100; should they not, the tail goes to the last
        // backend with weight rather than to index 0.
        if let Some(last) = weights.iter().rposition(|w| *w > 0) {
            for slot in by_bucket.iter_mut().skip(next) {
                *slot = last as u8;
            }
        }
        Self {
            generation,
            weights,
            overrides,
            by_bucket,
        }
    }

    pub fn backend_of_bucket(&self, bucket: u32) -> usize {
        usize::from(self.by_bucket[(bucket % BUCKETS) as usize])
    }
}

/// Visits all 100 buckets once per 100 requests, spread out (37 is coprime with 100), so any
/// 100 consecutive requests follow the weights exactly.
const STRIDE: u32 = 37;

pub struct Split {
    table: ArcSwap<Table>,
    counter: AtomicU32,
    sticky: Option<KeySource>,
    overrides: Vec<(KeySource, HeaderValueMatch, usize)>,
    names: Vec<String>,
}

/// The exact value an override wants.
type HeaderValueMatch = Vec<u8>;

impl Split {
    pub fn new(route: &Route) -> Self {
        let names: Vec<String> = route.backends.iter().map(|b| b.upstream.clone()).collect();
        let index = |u: &str| names.iter().position(|n| n == u);
        let overrides = route
            .overrides
            .iter()
            .filter_map(|o: &BackendOverride| {
                let (source, value) = match (&o.header, &o.cookie) {
                    (Some(h), _) => (KeySource::parse(Some(&h.name), None)?, h.value.as_bytes().to_vec()),
                    (None, Some(c)) => (KeySource::parse(None, Some(&c.name))?, c.value.as_bytes().to_vec()),
                    (None, None) => return None,
                };
                Some((source, value, index(&o.upstream)?))
            })
            .collect();
        let sticky = route
            .sticky
            .as_ref()
            .and_then(|s: &StickyKey| KeySource::parse(s.header.as_deref(), s.cookie.as_deref()));
        let weights = route.backends.iter().map(|b: &Backend| b.weight).collect();
        Self {
            table: ArcSwap::from_pointee(Table::new(0, weights, true)),
            counter: AtomicU32::new(0),
            sticky,
            overrides,
            names,
        }
    }

    /// The backend index for a request.
    pub fn choose(&self, headers: &HeaderMap) -> usize {
        let table = self.table.load();
        if table.overrides {
            for (source, value, index) in &self.overrides {
                if source.value(headers) == Some(value.as_slice()) {
                    return *index;
                }
            }
        }
        if let Some(key) = self.sticky.as_ref().and_then(|s| s.value(headers)) {
            return table.backend_of_bucket(bucket_of(key));
        }
        let n = self.counter.fetch_add(1, Ordering::Relaxed) % BUCKETS;
        table.backend_of_bucket(n.wrapping_mul(STRIDE) % BUCKETS)
    }

    pub fn table(&self) -> Arc<Table> {
        self.table.load_full()
    }

    /// Takes live weights (already checked against the route) unless an equal or newer
    /// generation is in force. Returns whether they were taken.
    pub fn apply(&self, w: &LiveWeights) -> bool {
        if w.generation <= self.table.load().generation {
            return false;
        }
        let weights = self
            .names
            .iter()
            .map(|n| w.weights.get(n).copied().unwrap_or(0))
            .collect();
        self.table
            .store(Arc::new(Table::new(w.generation, weights, w.overrides)));
        true
    }

    /// The live weights in force, if any were applied.
    pub fn live(&self, route: &str) -> Option<LiveWeights> {
        let t = self.table.load();
        (t.generation > 0).then(|| LiveWeights {
            route: route.to_string(),
            generation: t.generation,
            weights: self.names.iter().cloned().zip(t.weights.iter().copied()).collect(),
            overrides: t.overrides,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(yaml: &str) -> Route {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn two(w_canary: u8) -> Route {
        route(&format!(
            "name: r\nbackends: [{{upstream: canary, weight: {w_canary}}}, {{upstream: stable, weight: {}}}]\nsticky: {{header: x-user}}\noverrides: [{{header: {{name: x-canary, value: always}}, upstream: canary}}, {{cookie: {{name: v, value: old}}, upstream: stable}}]",
            100 - w_canary
        ))
    }

    #[test]
    fn the_rotation_is_exact_every_hundred_requests() {
        for w in [0u8, 1, 5, 30, 50, 99, 100] {
            let s = Split::new(&two(w));
            let h = HeaderMap::new();
            let canary = (0..10_000).filter(|_| s.choose(&h) == 0).count();
            assert_eq!(canary, usize::from(w) * 100, "weight {w}");
        }
    }

    #[test]
    fn sticky_users_never_leave_the_canary_while_its_weight_grows() {
        let mut previous: Option<Vec<usize>> = None;
        for w in [0u8, 5, 30, 60, 100] {
            let s = Split::new(&two(w));
            let picks: Vec<usize> = (0..2000)
                .map(|u| {
                    let mut h = HeaderMap::new();
                    h.insert("x-user", HeaderValue::from_str(&format!("user-{u}")).unwrap());
                    s.choose(&h)
                })
                .collect();
            let on_canary = picks.iter().filter(|p| **p == 0).count() as f64 / 2000.0;
            assert!(
                (on_canary - f64::from(w) / 100.0).abs() < 0.05,
                "weight {w}: {on_canary}"
            );
            if let Some(prev) = &previous {
                for (u, (a, b)) in prev.iter().zip(&picks).enumerate() {
                    assert!(*a != 0 || *b != 1, "user-{u} moved back to stable at weight {w}");
                }
            }
            previous = Some(picks);
        }
    }

    #[test]
    fn overrides_win_over_weights_and_stickiness() {
        let s = Split::new(&two(0));
        let mut h = HeaderMap::new();
        h.insert("x-canary", HeaderValue::from_static("always"));
        h.insert("x-user", HeaderValue::from_static("anyone"));
        assert_eq!(s.choose(&h), 0);
        let s = Split::new(&two(100));
        let mut h = HeaderMap::new();
        h.insert("cookie", HeaderValue::from_static("a=1; v=old"));
        assert_eq!(s.choose(&h), 1);
        // Forced routing switched off by live weights: the split rules again.
        s.apply(&LiveWeights {
            route: "r".into(),
            generation: 1,
            weights: [("canary".to_string(), 0), ("stable".to_string(), 100)].into(),
            overrides: false,
        });
        let mut h = HeaderMap::new();
        h.insert("x-canary", HeaderValue::from_static("always"));
        assert_eq!(s.choose(&h), 1);
    }

    #[test]
    fn live_weights_replace_only_older_generations() {
        let s = Split::new(&two(0));
        let w = |generation, c: u8| LiveWeights {
            route: "r".into(),
            generation,
            weights: [("canary".to_string(), c), ("stable".to_string(), 100 - c)].into(),
            overrides: true,
        };
        assert!(s.apply(&w(2, 30)));
        assert!(!s.apply(&w(1, 5)), "a stale generation must not undo a newer one");
        assert!(!s.apply(&w(2, 5)));
        assert_eq!(s.table().weights, vec![30, 70]);
        assert_eq!(s.live("r"), Some(w(2, 30)));
    }

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.append("cookie", HeaderValue::from_static("a=1; uid=42 ;b=2"));
        assert_eq!(cookie_value(&h, "uid"), Some(&b"42"[..]));
        assert_eq!(cookie_value(&h, "ui"), None);
    }
}
