//! Where measurements come from: the proxies' own /metrics scraped directly (works with no
//! Prometheus), or PromQL generated from the same metric names.

use proxyfleet_config::metric_names as names;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use super::analysis::Window;

/// An HTTP call to a pod or to Prometheus that did not give a usable answer.
#[derive(Debug, thiserror::Error)]
#[error("{url}: {failure}")]
pub struct HttpError {
    pub url: String,
    pub failure: HttpFailure,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpFailure {
    #[error("not a URL: {0}")]
    BadUrl(String),
    #[error("timed out")]
    TimedOut,
    #[error("{0}")]
    Transport(String),
    #[error("HTTP {0}: {1}")]
    Status(http::StatusCode, String),
    #[error("body: {0} (at most {MAX_BODY_BYTES} bytes are read)")]
    Body(String),
}

/// Why a measurement could not be taken: the window is then inconclusive, never a pass.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("listing the proxy pods of {namespace}/{fleet}: {source}")]
    ListPods {
        namespace: String,
        fleet: String,
        source: kube::Error,
    },
    #[error("Prometheus at {address}: {problem}")]
    Prometheus { address: String, problem: String },
    #[error("no proxy pod of {namespace}/{fleet} could be scraped")]
    NoPodScraped { namespace: String, fleet: String },
    /// A Ready canary pod whose figures are missing: the window would judge the canary on the
    /// pods that answered, which may be the healthy ones.
    #[error("canary pod {namespace}/{pod} is Ready but could not be scraped: {problem}")]
    CanaryPodNotScraped {
        namespace: String,
        pod: String,
        problem: String,
    },
}

/// Counters of one pod, as scraped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodCounters {
    pub requests: f64,
    pub errors_5xx: f64,
    /// (le, cumulative count), summed over routes, sorted by le.
    pub buckets: Vec<(f64, f64)>,
    /// When the pod started (unix seconds; Pod `status.startTime`), if known.
    pub started_at: Option<i64>,
}

fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let start = labels.find(&key)? + key.len();
    let end = labels[start..].find('"')?;
    Some(&labels[start..start + end])
}

/// Parses the proxy's Prometheus text into per-pod totals.
pub fn parse_proxy_metrics(text: &str) -> PodCounters {
    parse_proxy_metrics_of(text, None)
}

/// Per-pod totals of the series whose `upstream` label is `upstream` (all when None): one
/// backend of a split route.
pub fn parse_proxy_metrics_of(text: &str, upstream: Option<&str>) -> PodCounters {
    let mut out = PodCounters::default();
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        if upstream.is_some() && label(labels, "upstream") != upstream {
            continue;
        }
        match name {
            names::RESPONSES_TOTAL => {
                out.requests += value;
                if label(labels, names::CODE_CLASS) == Some("5xx") {
                    out.errors_5xx += value;
                }
            }
            names::REQUEST_DURATION_BUCKET => {
                let le = match label(labels, "le") {
                    Some("+Inf") => f64::INFINITY,
                    Some(v) => v.parse().unwrap_or(f64::INFINITY),
                    None => continue,
                };
                match buckets.iter_mut().find(|(b, _)| *b == le) {
                    Some(b) => b.1 += value,
                    None => buckets.push((le, value)),
                }
            }
            _ => {}
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    out.buckets = buckets;
    out
}

/// Which track's pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Track {
    Canary,
    Stable,
}

/// Per-pod counters of both tracks at one time.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub at: i64,
    pub canary: HashMap<String, PodCounters>,
    pub stable: HashMap<String, PodCounters>,
}

/// What a pod served since `old` (its counters at `base_at`). A pod missing from the base counts
/// whole only if it started after it: one that was merely not scraped then carries everything
/// it served before the window (earlier revisions' canaries included), which would drown the
/// window's own traffic; it sits this window out.
fn delta(new: &PodCounters, old: Option<&PodCounters>, base_at: i64) -> PodCounters {
    let Some(old) = old else {
        return match new.started_at {
            Some(started) if started >= base_at => new.clone(),
            _ => PodCounters::default(),
        };
    };
    // A counter that went down means the pod restarted: count from zero.
    if old.requests > new.requests {
        return new.clone();
    }
    PodCounters {
        requests: new.requests - old.requests,
        errors_5xx: (new.errors_5xx - old.errors_5xx).max(0.0),
        buckets: new
            .buckets
            .iter()
            .map(|(le, c)| {
                (
                    *le,
                    (c - old.buckets.iter().find(|(l, _)| l == le).map_or(0.0, |b| b.1)).max(0.0),
                )
            })
            .collect(),
        started_at: new.started_at,
    }
}

/// What a track served between two snapshots, summed over its pods.
pub fn window_between(new: &HashMap<String, PodCounters>, old: &Snapshot, track: Track) -> Window {
    let old_pods = match track {
        Track::Canary => &old.canary,
        Track::Stable => &old.stable,
    };
    let mut w = Window::default();
    for (pod, counters) in new {
        let d = delta(counters, old_pods.get(pod), old.at);
        w.requests += d.requests;
        w.errors_5xx += d.errors_5xx;
        for (le, c) in d.buckets {
            match w.buckets.iter_mut().find(|(b, _)| *b == le) {
                Some(b) => b.1 += c,
                None => w.buckets.push((le, c)),
            }
        }
    }
    w.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    w
}

/// Keeps recent snapshots per ProxyDeployment so windows can be computed from deltas.
#[derive(Default)]
pub struct SnapshotHistory {
    by_fleet: Mutex<HashMap<String, VecDeque<Snapshot>>>,
}

impl SnapshotHistory {
    /// Records `snap` and returns the (canary, stable) windows covering about `window` seconds,
    /// or None when there is no earlier snapshot yet (the first is a baseline).
    /// Stores `snap` and returns the (canary, stable) windows since the newest snapshot at least
    /// `window` old, with the time that window starts.
    pub fn push(&self, fleet: &str, snap: Snapshot, window: i64) -> Option<(Window, Window, i64)> {
        let mut all = self.by_fleet.lock().ok()?;
        let history = all.entry(fleet.to_string()).or_default();
        // The newest snapshot at least `window` old, else the oldest we have.
        let base = history
            .iter()
            .rev()
            .find(|s| snap.at - s.at >= window)
            .or(history.front())
            .cloned();
        history.push_back(snap.clone());
        while history.len() > 64 || history.front().is_some_and(|s| snap.at - s.at > window * 4 + 60) {
            history.pop_front();
        }
        let base = base?;
        Some((
            window_between(&snap.canary, &base, Track::Canary),
            window_between(&snap.stable, &base, Track::Stable),
            base.at,
        ))
    }

    pub fn forget(&self, fleet: &str) {
        if let Ok(mut all) = self.by_fleet.lock() {
            all.remove(fleet);
        }
    }
}

/// How many proxy pods are scraped, read or pushed to at once: a fleet of many proxies is
/// gone through in about the time of one slow pod per eight, not of all of them in turn.
pub const PODS_AT_ONCE: usize = 8;

/// Largest body read from a pod or Prometheus: a proxy's /metrics is tens of KiB.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// A small HTTP client for scraping pods and asking Prometheus.
pub struct HttpGetter {
    client: Client<HttpConnector, Empty<Bytes>>,
    writer: Client<HttpConnector, Full<Bytes>>,
}

impl Default for HttpGetter {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector.clone()),
            writer: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}

impl HttpGetter {
    /// PUTs `body` with a bearer token; Ok on a 2xx, else the status and the answer's text.
    pub async fn put(&self, url: &str, token: &str, body: String) -> Result<(), HttpError> {
        let fail = |failure| HttpError {
            url: url.to_string(),
            failure,
        };
        let req = http::Request::put(url)
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| fail(HttpFailure::BadUrl(e.to_string())))?;
        let resp = tokio::time::timeout(Duration::from_secs(3), self.writer.request(req))
            .await
            .map_err(|_| fail(HttpFailure::TimedOut))?
            .map_err(|e| fail(HttpFailure::Transport(e.to_string())))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let limited = http_body_util::Limited::new(resp.into_body(), 4096);
        let text = match tokio::time::timeout(Duration::from_secs(3), limited.collect()).await {
            Ok(Ok(b)) => String::from_utf8_lossy(&b.to_bytes()).trim().to_string(),
            _ => String::new(),
        };
        Err(fail(HttpFailure::Status(status, text)))
    }

    pub async fn get(&self, url: &str) -> Result<String, HttpError> {
        let fail = |failure| HttpError {
            url: url.to_string(),
            failure,
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| fail(HttpFailure::BadUrl(e.to_string())))?;
        let resp = tokio::time::timeout(Duration::from_secs(3), self.client.get(uri))
            .await
            .map_err(|_| fail(HttpFailure::TimedOut))?
            .map_err(|e| fail(HttpFailure::Transport(e.to_string())))?;
        let status = resp.status();
        // A pod's image is the tenant's: a body without end must not exhaust the operator.
        let limited = http_body_util::Limited::new(resp.into_body(), MAX_BODY_BYTES);
        let body = tokio::time::timeout(Duration::from_secs(3), limited.collect())
            .await
            .map_err(|_| fail(HttpFailure::Body("timed out".into())))?
            .map_err(|e| fail(HttpFailure::Body(e.to_string())))?
            .to_bytes();
        if !status.is_success() {
            return Err(fail(HttpFailure::Status(status, String::new())));
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}

pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Runs an instant PromQL query and returns its single scalar result.
pub async fn prometheus_scalar(http: &HttpGetter, address: &str, query: &str) -> Result<Option<f64>, MeasureError> {
    let url = format!(
        "{}/api/v1/query?query={}",
        address.trim_end_matches('/'),
        url_encode(query)
    );
    let body = http.get(&url).await?;
    let problem = |problem: String| MeasureError::Prometheus {
        address: address.to_string(),
        problem,
    };
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| problem(format!("the answer is not JSON: {e}")))?;
    if v["status"] != "success" {
        return Err(problem(format!("error: {}", v["error"])));
    }
    let Some(first) = v["data"]["result"].as_array().and_then(|r| r.first()) else {
        return Ok(None);
    };
    let value = first["value"][1].as_str().and_then(|s| s.parse::<f64>().ok());
    Ok(value.filter(|x| x.is_finite()))
}

/// The PromQL label matchers of one track's pods. Prometheus must attach the pod's
/// `namespace` and the labels `proxydeployment`, `track` and `revision` (see docs/canary.md for
/// the scrape config). The revision keeps a window from mixing in an earlier canary's pods —
/// an aborted canary's 5xx would otherwise count against the next one for a whole window.
pub fn track_selector(namespace: &str, name: &str, track: &str, revision: Option<&str>) -> String {
    let mut sel = format!("namespace=\"{namespace}\",proxydeployment=\"{name}\",track=\"{track}\"");
    if let Some(revision) = revision {
        sel.push_str(&format!(",revision=\"{revision}\""));
    }
    sel
}

/// PromQL for the built-in metrics of the pods `selector` matches: requests, 5xx, P99 (ms).
pub fn builtin_queries(selector: &str, window_secs: i64) -> [String; 3] {
    [
        format!(
            "sum(increase({}{{{selector}}}[{window_secs}s]))",
            names::RESPONSES_TOTAL
        ),
        format!(
            "sum(increase({}{{{selector},{}=\"5xx\"}}[{window_secs}s]))",
            names::RESPONSES_TOTAL,
            names::CODE_CLASS
        ),
        format!(
            "1000 * histogram_quantile(0.99, sum by (le) (rate({}{{{selector}}}[{window_secs}s])))",
            names::REQUEST_DURATION_BUCKET
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = r#"# HELP proxyfleet_responses Responses
# TYPE proxyfleet_responses counter
proxyfleet_responses_total{route="all",upstream="echo",code_class="2xx"} 90
proxyfleet_responses_total{route="all",upstream="echo",code_class="5xx"} 10
proxyfleet_responses_total{route="",upstream="",code_class="4xx"} 5
proxyfleet_request_duration_seconds_bucket{le="0.001",route="all",upstream="echo"} 50
proxyfleet_request_duration_seconds_bucket{le="0.01",route="all",upstream="echo"} 100
proxyfleet_request_duration_seconds_bucket{le="+Inf",route="all",upstream="echo"} 100
proxyfleet_request_duration_seconds_bucket{le="0.001",route="",upstream=""} 5
proxyfleet_request_duration_seconds_bucket{le="0.01",route="",upstream=""} 5
proxyfleet_request_duration_seconds_bucket{le="+Inf",route="",upstream=""} 5
# EOF
"#;

    #[test]
    fn parses_counters_and_buckets() {
        let c = parse_proxy_metrics(SCRAPE);
        assert_eq!(c.requests, 105.0);
        assert_eq!(c.errors_5xx, 10.0);
        assert_eq!(c.buckets, vec![(0.001, 55.0), (0.01, 105.0), (f64::INFINITY, 105.0)]);
    }

    #[test]
    fn windows_are_deltas_and_survive_pod_restarts() {
        let old = HashMap::from([(
            "a".to_string(),
            PodCounters {
                requests: 100.0,
                errors_5xx: 10.0,
                buckets: vec![(f64::INFINITY, 100.0)],
                started_at: None,
            },
        )]);
        let new = HashMap::from([
            (
                "a".to_string(),
                PodCounters {
                    requests: 150.0,
                    errors_5xx: 20.0,
                    buckets: vec![(f64::INFINITY, 150.0)],
                    started_at: None,
                },
            ),
            // restarted pod: its counters start again from zero
            (
                "b".to_string(),
                PodCounters {
                    requests: 7.0,
                    errors_5xx: 0.0,
                    buckets: vec![(f64::INFINITY, 7.0)],
                    started_at: Some(1_000),
                },
            ),
            // A long-running pod the base missed (its scrape failed): not this window's.
            (
                "c".to_string(),
                PodCounters {
                    requests: 1_000_000.0,
                    errors_5xx: 1_000.0,
                    buckets: vec![(f64::INFINITY, 1_000_000.0)],
                    started_at: Some(10),
                },
            ),
        ]);
        let base = Snapshot {
            at: 990,
            canary: old,
            stable: HashMap::new(),
        };
        let w = window_between(&new, &base, Track::Canary);
        assert_eq!(w.requests, 57.0);
        assert_eq!(w.errors_5xx, 10.0);
    }

    #[test]
    fn history_gives_a_window_after_a_baseline() {
        let h = SnapshotHistory::default();
        let snap = |at, n: f64| Snapshot {
            at,
            canary: HashMap::from([(
                "c".to_string(),
                PodCounters {
                    requests: n,
                    errors_5xx: 0.0,
                    buckets: vec![],
                    started_at: None,
                },
            )]),
            stable: HashMap::new(),
        };
        assert!(h.push("ns/demo", snap(0, 0.0), 30).is_none());
        let (c, _, _) = h.push("ns/demo", snap(10, 50.0), 30).unwrap();
        assert_eq!(c.requests, 50.0);
        h.push("ns/demo", snap(40, 200.0), 30);
        let (c, _, _) = h.push("ns/demo", snap(50, 260.0), 30).unwrap();
        // base is the newest snapshot at least 30 s old: t=10 (50 requests)
        assert_eq!(c.requests, 210.0);
    }

    /// A tenant's pod answering /metrics with an endless body is cut off at the cap.
    #[tokio::test]
    async fn an_oversized_body_is_refused_not_buffered() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = tcp.read(&mut request).await;
            let _ = tcp
                .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                .await;
            let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, "x".repeat(64 * 1024));
            for _ in 0..(MAX_BODY_BYTES / (64 * 1024) + 8) {
                if tcp.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
        let err = HttpGetter::default()
            .get(&format!("http://{addr}/metrics"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("at most"), "{err}");
    }

    #[test]
    fn queries_name_the_track() {
        let q = builtin_queries(&track_selector("web", "demo", "canary", Some("abc123")), 30);
        assert!(q[1].contains("revision=\"abc123\""), "{}", q[1]);
        assert!(!track_selector("web", "demo", "stable", None).contains("revision"));
        assert!(q[1].contains("code_class=\"5xx\""));
        assert!(q[2].contains("histogram_quantile(0.99"));
        assert_eq!(url_encode("a b{c}"), "a%20b%7Bc%7D");
    }
}
