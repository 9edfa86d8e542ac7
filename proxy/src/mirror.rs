//! Shadow traffic: a copy of a share of a route's requests goes to another upstream from a task
//! of its own. The client's request never waits for it and never sees its result; only
//! `proxyfleet_mirror_requests_total` does. A body is copied when its Content-Length is at most
//! `MAX_BODY` (it is read whole first, then both copies send it); a larger or chunked body is
//! not mirrored (`result="skipped"`). A mirror endpoint at its connection limit is skipped rather
//! than queued for, so a slow mirror cannot pile up tasks.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use http::{HeaderMap, Request, Version};
use http_body_util::BodyExt;
use prometheus_client::metrics::counter::Counter;

use proxyfleet_config::Mirror;

use crate::body::UpstreamBody;
use crate::metrics::{Metrics, MirrorLabels, CODE_CLASSES};
use crate::upstream::{self, UpstreamCluster};

/// Largest request body copied to a mirror.
pub const MAX_BODY: u64 = 64 * 1024;

pub struct CompiledMirror {
    upstream: Arc<UpstreamCluster>,
    percent: f64,
    timeout: Duration,
    /// By code class (as `CODE_CLASSES`), then `error` and `skipped`.
    results: Arc<[Counter; 7]>,
}

impl CompiledMirror {
    pub fn new(route: &str, m: &Mirror, upstream: Arc<UpstreamCluster>, timeout: Duration, metrics: &Metrics) -> Self {
        let counter = |result| {
            metrics
                .mirror_requests
                .get_or_create(&MirrorLabels {
                    route: route.to_string(),
                    upstream: m.upstream.clone(),
                    result,
                })
                .clone()
        };
        let results = Arc::new([
            counter(CODE_CLASSES[0]),
            counter(CODE_CLASSES[1]),
            counter(CODE_CLASSES[2]),
            counter(CODE_CLASSES[3]),
            counter(CODE_CLASSES[4]),
            counter("error"),
            counter("skipped"),
        ]);
        Self {
            upstream,
            percent: m.percent,
            timeout,
            results,
        }
    }

    /// Whether this request falls in the mirrored share.
    pub fn sampled(&self) -> bool {
        self.percent > 0.0 && fastrand::f64() * 100.0 < self.percent
    }

    /// Counts a sampled request that is not copied (its body is too large or unsized).
    pub fn skip(&self) {
        self.results[6].inc();
    }

    /// Sends a copy of this request (with `body`, possibly empty).
    pub fn copy(&self, parts: &http::request::Parts, body: Bytes) {
        let endpoints = self.upstream.endpoints.load();
        let Some(endpoint) = upstream::pick_avoiding(&endpoints, None).cloned() else {
            self.results[5].inc();
            return;
        };
        drop(endpoints);
        let pq = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        let Ok(uri) = self.upstream.request_uri(&endpoint.authority, pq) else {
            return;
        };
        let body = if body.is_empty() {
            UpstreamBody::Empty
        } else {
            UpstreamBody::Buffered { data: Some(body) }
        };
        let mut req = Request::new(body);
        *req.method_mut() = parts.method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = Version::HTTP_11;
        *req.headers_mut() = copy_headers(&parts.headers);
        let (cluster, results, timeout) = (self.upstream.clone(), self.results.clone(), self.timeout);
        tokio::spawn(async move {
            let Ok(_permit) = endpoint.permits.try_acquire() else {
                results[6].inc();
                return;
            };
            let sent = tokio::time::timeout(timeout, async {
                let (resp, _) = cluster.send(&endpoint, req).await.ok()?;
                let status = resp.status().as_u16();
                // Read and drop the body so the connection goes back to the pool.
                resp.into_body().collect().await.ok()?;
                Some(status)
            });
            match sent.await {
                Ok(Some(status)) => results[crate::metrics::class_index(status)].inc(),
                _ => results[5].inc(),
            };
        });
    }
}

/// The request's headers for the mirror, marked so the mirror's logs can tell copies apart.
fn copy_headers(headers: &HeaderMap) -> HeaderMap {
    let mut h = headers.clone();
    crate::forwarding::strip_hop_by_hop(&mut h);
    h.insert("x-proxyfleet-mirror", http::HeaderValue::from_static("1"));
    h
}
