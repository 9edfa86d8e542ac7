//! W3C trace context (https://www.w3.org/TR/trace-context/): a request's `traceparent` is
//! continued, or a trace started (sampled by rate); the proxy's span becomes the parent the
//! upstream sees. Sampled spans are sent to an OTLP/HTTP collector as OTLP JSON by a task of
//! their own, through a bounded queue (a full queue drops and counts, never blocks).
//!
//! Hand-written rather than the opentelemetry SDK: the proxy records one span per request
//! with a fixed set of attributes, and the SDK with its OTLP exporter would bring reqwest or
//! tonic and a per-span allocation-heavy model into the request path (docs/decisions.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use prometheus_client::metrics::counter::Counter;
use proxyfleet_config::TraceSettings;
use tokio::sync::mpsc;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
/// Spans waiting for the exporter; beyond this they are dropped.
const QUEUE: usize = 8192;
/// Spans per export request.
const BATCH: usize = 512;

/// The tracing settings of a configuration, with the exporter they send to.
pub struct Tracer {
    sample_percent: f64,
    exporter: Option<Arc<Exporter>>,
}

impl Tracer {
    /// Must run inside the runtime (the exporter is a task).
    pub fn new(settings: &TraceSettings, dropped: Counter) -> Self {
        Self {
            sample_percent: settings.sample_percent,
            exporter: settings.otlp_endpoint.as_deref().map(|e| {
                Exporter::for_endpoint(
                    e,
                    settings.service_name.as_deref().unwrap_or("proxyfleet-proxy"),
                    dropped,
                )
            }),
        }
    }

    /// Continues or starts the request's trace and rewrites its `traceparent` so the upstream
    /// sees the proxy's span as its parent.
    pub fn start(&self, headers: &mut HeaderMap) -> SpanContext {
        let parent = headers.get(&TRACEPARENT).and_then(parse_traceparent);
        if parent.is_none() {
            headers.remove(&TRACESTATE); // a tracestate without a valid traceparent is void
        }
        let (trace_id, parent_span, sampled) = match parent {
            Some(p) => (p.trace_id, Some(p.span_id), p.sampled),
            None => (
                nonzero_u128(),
                None,
                self.sample_percent >= 100.0 || fastrand::f64() * 100.0 < self.sample_percent,
            ),
        };
        let span = SpanContext {
            trace_id,
            span_id: nonzero_u64(),
            parent_span,
            sampled,
            start: SystemTime::now(),
        };
        headers.insert(TRACEPARENT, span.traceparent());
        span
    }

    /// Whether spans of this trace are exported.
    pub fn records(&self, span: &SpanContext) -> bool {
        span.sampled && self.exporter.is_some()
    }

    pub fn finish(&self, span: SpanContext, facts: SpanFacts) {
        if let Some(e) = &self.exporter {
            if span.sampled {
                e.send(FinishedSpan {
                    span,
                    end: SystemTime::now(),
                    facts,
                });
            }
        }
    }
}

/// A parsed `traceparent`.
#[derive(Debug, PartialEq, Eq)]
struct Parent {
    trace_id: u128,
    span_id: u64,
    sampled: bool,
}

/// `00-<32 hex>-<16 hex>-<2 hex>`; ids must not be all zero. Later versions are read by the
/// same rule (the spec asks so) when they are at least as long.
fn parse_traceparent(v: &HeaderValue) -> Option<Parent> {
    let s = v.to_str().ok()?;
    let mut parts = s.split('-');
    let version = parts.next()?;
    let (trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?);
    let hex = |t: &str| t.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if version.len() != 2 || version == "ff" || !hex(version) || (version == "00" && parts.next().is_some()) {
        return None;
    }
    if trace.len() != 32 || span.len() != 16 || flags.len() != 2 || !hex(trace) || !hex(span) || !hex(flags) {
        return None;
    }
    let trace_id = u128::from_str_radix(trace, 16).ok()?;
    let span_id = u64::from_str_radix(span, 16).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    (trace_id != 0 && span_id != 0).then_some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

fn nonzero_u128() -> u128 {
    fastrand::u128(1..)
}
fn nonzero_u64() -> u64 {
    fastrand::u64(1..)
}

/// The proxy's span of one request.
#[derive(Clone, Debug)]
pub struct SpanContext {
    pub trace_id: u128,
    pub span_id: u64,
    pub parent_span: Option<u64>,
    pub sampled: bool,
    start: SystemTime,
}

impl SpanContext {
    fn traceparent(&self) -> HeaderValue {
        let s = format!(
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id,
            self.span_id,
            u8::from(self.sampled)
        );
        // Hex digits and dashes only: always a valid header value.
        HeaderValue::from_str(&s).unwrap_or(HeaderValue::from_static("00"))
    }
}

/// What a span says about its request.
#[derive(Default)]
pub struct SpanFacts {
    pub method: String,
    pub path: String,
    pub authority: Option<String>,
    pub status: u16,
    pub route: Option<Arc<str>>,
    pub upstream: Option<Arc<str>>,
    pub endpoint: Option<http::uri::Authority>,
    pub client_ip: String,
}

struct FinishedSpan {
    span: SpanContext,
    end: SystemTime,
    facts: SpanFacts,
}

/// Exporters by (endpoint, service name).
type ExportersByTarget = HashMap<(String, String), Arc<Exporter>>;

/// Sends spans to one collector, for the whole process.
pub struct Exporter {
    tx: mpsc::Sender<FinishedSpan>,
    dropped: Counter,
}

impl Exporter {
    fn for_endpoint(endpoint: &str, service: &str, dropped: Counter) -> Arc<Self> {
        static EXPORTERS: OnceLock<Mutex<ExportersByTarget>> = OnceLock::new();
        let mut all = EXPORTERS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        all.entry((endpoint.to_string(), service.to_string()))
            .or_insert_with(|| {
                let (tx, rx) = mpsc::channel(QUEUE);
                let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
                tokio::spawn(export_loop(rx, url, service.to_string()));
                Arc::new(Self { tx, dropped })
            })
            .clone()
    }

    fn send(&self, span: FinishedSpan) {
        if self.tx.try_send(span).is_err() {
            self.dropped.inc();
        }
    }
}

/// Batches spans (up to `BATCH`, or what arrived within a second) and POSTs each batch.
async fn export_loop(mut rx: mpsc::Receiver<FinishedSpan>, url: String, service: String) {
    let client: Client<HttpConnector, Full<bytes::Bytes>> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        while batch.len() < BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(s)) => batch.push(s),
                _ => break,
            }
        }
        let body = otlp_json(&service, &batch);
        batch.clear();
        let Ok(req) = http::Request::post(&url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(bytes::Bytes::from(body)))
        else {
            continue;
        };
        match tokio::time::timeout(Duration::from_secs(5), client.request(req)).await {
            Ok(Ok(resp)) if resp.status().is_success() => {}
            Ok(Ok(resp)) => tracing::debug!(%url, status = %resp.status(), "OTLP export refused"),
            Ok(Err(e)) => tracing::debug!(%url, error = %e, "OTLP export failed"),
            Err(_) => tracing::debug!(%url, "OTLP export timed out"),
        }
    }
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos().to_string()
}

fn attr(key: &str, value: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"key": key, "value": value})
}

/// An ExportTraceServiceRequest in OTLP's JSON encoding (ids as hex, kind SERVER = 2, status
/// ERROR = 2 for 5xx).
fn otlp_json(service: &str, spans: &[FinishedSpan]) -> Vec<u8> {
    use serde_json::json;
    let spans: Vec<_> = spans
        .iter()
        .map(|s| {
            let f = &s.facts;
            let mut attrs = vec![
                attr("http.request.method", json!({"stringValue": f.method})),
                attr("url.path", json!({"stringValue": f.path})),
                attr("http.response.status_code", json!({"intValue": f.status.to_string()})),
                attr("client.address", json!({"stringValue": f.client_ip})),
            ];
            let optional = [
                ("server.address", f.authority.as_deref()),
                ("proxyfleet.route", f.route.as_deref()),
                ("proxyfleet.upstream", f.upstream.as_deref()),
                ("proxyfleet.endpoint", f.endpoint.as_ref().map(|a| a.as_str())),
            ];
            for (k, v) in optional {
                if let Some(v) = v {
                    attrs.push(attr(k, json!({ "stringValue": v })));
                }
            }
            let mut span = json!({
                "traceId": format!("{:032x}", s.span.trace_id),
                "spanId": format!("{:016x}", s.span.span_id),
                "name": format!("{} {}", f.method, f.route.as_deref().unwrap_or("-")),
                "kind": 2,
                "startTimeUnixNano": nanos(s.span.start),
                "endTimeUnixNano": nanos(s.end),
                "attributes": attrs,
                "status": {"code": if f.status >= 500 { 2 } else { 0 }},
            });
            if let Some(p) = s.span.parent_span {
                span["parentSpanId"] = json!(format!("{p:016x}"));
            }
            span
        })
        .collect();
    let doc = json!({"resourceSpans": [{
        "resource": {"attributes": [attr("service.name", json!({"stringValue": service}))]},
        "scopeSpans": [{"scope": {"name": "proxyfleet-proxy", "version": env!("CARGO_PKG_VERSION")}, "spans": spans}],
    }]});
    serde_json::to_vec(&doc).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracer(percent: f64) -> Tracer {
        Tracer {
            sample_percent: percent,
            exporter: None,
        }
    }

    #[test]
    fn a_valid_traceparent_is_continued_with_a_new_span() {
        let mut h = HeaderMap::new();
        h.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        h.insert(TRACESTATE, HeaderValue::from_static("vendor=1"));
        let span = tracer(0.0).start(&mut h);
        assert_eq!(span.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(span.parent_span, Some(0x00f067aa0ba902b7));
        assert!(span.sampled, "the caller's decision is kept");
        let out = h[&TRACEPARENT].to_str().unwrap().to_string();
        assert!(out.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(
            !out.contains("00f067aa0ba902b7"),
            "the upstream's parent is the proxy's span"
        );
        assert_eq!(h[&TRACESTATE], "vendor=1");
    }

    #[test]
    fn invalid_or_missing_traceparents_start_a_trace() {
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "nonsense",
        ] {
            let mut h = HeaderMap::new();
            h.insert(TRACEPARENT, HeaderValue::from_static(bad));
            h.insert(TRACESTATE, HeaderValue::from_static("vendor=1"));
            let span = tracer(100.0).start(&mut h);
            assert!(span.parent_span.is_none(), "{bad}");
            assert!(span.sampled);
            assert!(h.get(&TRACESTATE).is_none(), "{bad}");
            assert!(parse_traceparent(&h[&TRACEPARENT]).is_some());
        }
        let mut h = HeaderMap::new();
        assert!(!tracer(0.0).start(&mut h).sampled);
        assert!(h[&TRACEPARENT].to_str().unwrap().ends_with("-00"));
    }

    #[test]
    fn otlp_json_has_the_collector_shape() {
        let span = FinishedSpan {
            span: SpanContext {
                trace_id: 1,
                span_id: 2,
                parent_span: Some(3),
                sampled: true,
                start: UNIX_EPOCH,
            },
            end: UNIX_EPOCH + Duration::from_millis(5),
            facts: SpanFacts {
                method: "GET".into(),
                path: "/x".into(),
                status: 502,
                route: Some("all".into()),
                ..Default::default()
            },
        };
        let v: serde_json::Value = serde_json::from_slice(&otlp_json("svc", &[span])).unwrap();
        let s = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(s["traceId"], "00000000000000000000000000000001");
        assert_eq!(s["parentSpanId"], "0000000000000003");
        assert_eq!(s["endTimeUnixNano"], "5000000");
        assert_eq!(s["status"]["code"], 2);
        assert_eq!(s["name"], "GET all");
        assert_eq!(
            v["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
            "svc"
        );
    }
}
