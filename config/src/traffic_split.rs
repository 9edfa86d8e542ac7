//! Splitting a route's traffic across several upstreams: weighted backends, sticky user
//! buckets, forced routing by header or cookie, and shadow traffic. The weights can change at
//! run time without a reload (`LiveWeights`, pushed through the admin listener).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::HeaderMatch;

/// Number of sticky buckets a key hashes into; weights are percentages of them.
pub const BUCKETS: u32 = 100;

/// One weighted backend of a route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Backend {
    /// One of `upstreams[].name`.
    #[schemars(length(min = 1, max = 63))]
    pub upstream: String,
    /// Share of requests, 0-100; the weights of a route's backends sum to 100. Sticky buckets are
    /// handed out in list order, so the first backend keeps its users while its weight grows.
    #[schemars(range(min = 0, max = 100))]
    pub weight: u8,
}

/// Where a sticky key is read from: a header or a cookie (exactly one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StickyKey {
    /// Request header holding the key (e.g. `x-user-id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub header: Option<String>,
    /// Cookie holding the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub cookie: Option<String>,
}

/// A cookie that must be present with exactly this value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CookieMatch {
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
    #[schemars(length(max = 1024))]
    pub value: String,
}

/// Sends matching requests to one backend whatever the weights (testers, A/B experiments).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendOverride {
    /// Header match (e.g. `x-canary: always`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<HeaderMatch>,
    /// Cookie match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<CookieMatch>,
    /// The backend's upstream, one of the route's `backends[].upstream`.
    #[schemars(length(min = 1, max = 63))]
    pub upstream: String,
}

/// Shadow traffic: a copy of a share of the route's requests goes to another upstream (bodies up
/// to 64 KiB with a Content-Length are copied; larger or chunked ones are not mirrored); its
/// responses are discarded and only counted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mirror {
    /// One of `upstreams[].name`.
    #[schemars(length(min = 1, max = 63))]
    pub upstream: String,
    /// Share of requests copied, 0-100.
    #[schemars(range(min = 0.0, max = 100.0))]
    pub percent: f64,
}

/// The sticky bucket (0-99) of a key: FNV-1a, stable across processes, versions and restarts
/// (std's hasher is seeded per process, so two proxies would disagree).
pub fn bucket_of(key: &[u8]) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(BUCKETS)) as u32
}
