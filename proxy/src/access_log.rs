//! Access logs: one JSON line per request, written by a thread of its own so the request path
//! never waits on a disk or a pipe. A request's line is sent when its response body is done
//! (or dropped, when the client goes away), so it carries the bytes really sent and the whole
//! duration. When the writer falls behind, lines are dropped and counted, never queued without
//! bound.

use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime};

use http::{HeaderValue, Method, Version};
use prometheus_client::metrics::counter::Counter;
use serde::Serialize;

/// Lines waiting for the writer; beyond this they are dropped.
const QUEUE: usize = 16 * 1024;

/// Where a listener's lines go: one writer thread per destination, for the whole process.
pub struct AccessLogger {
    tx: SyncSender<Record>,
    dropped: Counter,
}

impl AccessLogger {
    /// The logger writing to `path` (`None`: standard output), started on first use.
    pub fn for_path(path: Option<&str>, dropped: Counter) -> Arc<Self> {
        static WRITERS: OnceLock<Mutex<HashMap<String, Arc<AccessLogger>>>> = OnceLock::new();
        let key = path.unwrap_or("").to_string();
        let mut writers = WRITERS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        writers
            .entry(key)
            .or_insert_with(|| {
                let (tx, rx) = sync_channel(QUEUE);
                let path = path.map(str::to_string);
                let _ = std::thread::Builder::new()
                    .name("access-log".into())
                    .spawn(move || write_lines(rx, path));
                Arc::new(Self { tx, dropped })
            })
            .clone()
    }

    fn send(&self, record: Record) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(record) {
            self.dropped.inc();
        }
    }
}

/// A listener's access-log settings, resolved once per listener.
pub struct ListenerLog {
    pub logger: Arc<AccessLogger>,
    pub listener: Arc<str>,
    pub sample_percent: f64,
    pub include_query: bool,
}

impl ListenerLog {
    /// The listener's access log, when it has one.
    pub fn for_listener(
        listener: &proxyfleet_config::Listener,
        metrics: &crate::metrics::Metrics,
    ) -> Option<Arc<Self>> {
        let a = listener.access_log.as_ref()?;
        Some(Arc::new(Self {
            logger: AccessLogger::for_path(a.path.as_deref(), metrics.access_log_dropped.clone()),
            listener: listener.name.as_str().into(),
            sample_percent: a.sample_percent,
            include_query: a.include_query,
        }))
    }

    /// Whether this request is sampled (errors are logged whatever the sample).
    pub fn sampled(&self) -> bool {
        self.sample_percent >= 100.0 || fastrand::f64() * 100.0 < self.sample_percent
    }
}

/// What the request path knew when the response head left; the rest is added on completion.
pub struct Record {
    time: SystemTime,
    listener: Arc<str>,
    method: Method,
    version: Version,
    uri: http::Uri,
    host: Option<HeaderValue>,
    include_query: bool,
    status: u16,
    bytes_sent: u64,
    request_bytes: Option<u64>,
    head_ms: f64,
    duration_ms: f64,
    route: Option<Arc<str>>,
    upstream: Option<Arc<str>>,
    endpoint: Option<http::uri::Authority>,
    request_id: Option<HeaderValue>,
    traceparent: Option<HeaderValue>,
    tls: Option<(&'static str, bool)>,
    client_ip: IpAddr,
}

/// Set on a request that will be logged, so the phases record where it went.
#[derive(Clone, Copy)]
pub struct LogWanted;

/// Where a logged request went, put into its response's extensions by the request path.
#[derive(Clone, Default)]
pub struct Destination {
    pub route: Option<Arc<str>>,
    pub upstream: Option<Arc<str>>,
    pub endpoint: Option<http::uri::Authority>,
}

/// The request's side of a line, taken before the request is consumed: cheap clones of what
/// the request already holds (the URI and header values share its buffers).
pub struct RequestFacts {
    method: Method,
    version: Version,
    uri: http::Uri,
    host: Option<HeaderValue>,
    include_query: bool,
    request_bytes: Option<u64>,
    request_id: Option<HeaderValue>,
    traceparent: Option<HeaderValue>,
}

impl RequestFacts {
    pub fn of<B>(req: &http::Request<B>, include_query: bool) -> Self {
        let headers = req.headers();
        Self {
            method: req.method().clone(),
            version: req.version(),
            uri: req.uri().clone(),
            host: headers.get(http::header::HOST).cloned(),
            include_query,
            request_bytes: headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok()),
            request_id: headers.get("x-request-id").cloned(),
            traceparent: headers.get("traceparent").cloned(),
        }
    }
}

/// A line waiting for its response body to end; sent when dropped.
pub struct PendingLog {
    pub bytes: u64,
    started: Instant,
    record: Option<Box<Record>>,
    logger: Arc<AccessLogger>,
}

impl PendingLog {
    pub fn new(
        log: &ListenerLog,
        facts: RequestFacts,
        status: u16,
        dest: Destination,
        conn: (IpAddr, Option<(&'static str, bool)>),
        started: Instant,
    ) -> Self {
        let record = Record {
            time: SystemTime::now(),
            listener: log.listener.clone(),
            method: facts.method,
            version: facts.version,
            uri: facts.uri,
            host: facts.host,
            include_query: facts.include_query,
            status,
            bytes_sent: 0,
            request_bytes: facts.request_bytes,
            head_ms: started.elapsed().as_secs_f64() * 1000.0,
            duration_ms: 0.0,
            route: dest.route,
            upstream: dest.upstream,
            endpoint: dest.endpoint,
            request_id: facts.request_id,
            traceparent: facts.traceparent,
            tls: conn.1,
            client_ip: conn.0,
        };
        Self {
            bytes: 0,
            started,
            record: Some(Box::new(record)),
            logger: log.logger.clone(),
        }
    }
}

impl Drop for PendingLog {
    fn drop(&mut self) {
        if let Some(mut r) = self.record.take() {
            r.bytes_sent = self.bytes;
            r.duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
            self.logger.send(*r);
        }
    }
}

/// The line as written (field names are the documented log schema, docs/user-guide.md).
#[derive(Serialize)]
struct Line<'a> {
    time: String,
    listener: &'a str,
    client_ip: IpAddr,
    method: &'a str,
    protocol: &'static str,
    authority: Option<&'a str>,
    path: &'a str,
    status: u16,
    bytes_sent: u64,
    request_bytes: Option<u64>,
    time_to_headers_ms: f64,
    duration_ms: f64,
    route: Option<&'a str>,
    upstream: Option<&'a str>,
    endpoint: Option<&'a str>,
    request_id: Option<&'a str>,
    trace_id: Option<&'a str>,
    tls_version: Option<&'static str>,
    tls_resumed: Option<bool>,
}

fn protocol(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

/// The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`).
fn trace_id(tp: &HeaderValue) -> Option<&str> {
    let s = tp.to_str().ok()?;
    let id = s.split('-').nth(1)?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

fn render(r: &Record, out: &mut Vec<u8>) {
    // Never a `user:password@` a client put in an absolute URI or `:authority`.
    let authority = match r.uri.authority() {
        Some(a) => Some(a.as_str().rsplit('@').next().unwrap_or_default()),
        None => r.host.as_ref().and_then(|h| h.to_str().ok()),
    };
    let path = match (r.include_query, r.uri.path_and_query()) {
        (true, Some(pq)) => pq.as_str(),
        _ => r.uri.path(),
    };
    let line = Line {
        time: humantime::format_rfc3339_millis(r.time).to_string(),
        listener: &r.listener,
        client_ip: r.client_ip,
        method: r.method.as_str(),
        protocol: protocol(r.version),
        authority,
        path,
        status: r.status,
        bytes_sent: r.bytes_sent,
        request_bytes: r.request_bytes,
        time_to_headers_ms: (r.head_ms * 1000.0).round() / 1000.0,
        duration_ms: (r.duration_ms * 1000.0).round() / 1000.0,
        route: r.route.as_deref(),
        upstream: r.upstream.as_deref(),
        endpoint: r.endpoint.as_ref().map(|a| a.as_str()),
        request_id: r.request_id.as_ref().and_then(|v| v.to_str().ok()),
        trace_id: r.traceparent.as_ref().and_then(trace_id),
        tls_version: r.tls.map(|t| t.0),
        tls_resumed: r.tls.map(|t| t.1),
    };
    if serde_json::to_writer(&mut *out, &line).is_ok() {
        out.push(b'\n');
    }
}

/// How often the writer wakes to drain the queue. Senders never wake it (a wake-up per request
/// is a futex call and a context switch on the request's core); 16 Ki lines per 20 ms is room
/// for 800 000 lines a second.
const DRAIN_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// The writer thread: every `DRAIN_EVERY`, renders what is queued and writes it in one call,
/// so lines never interleave with other output.
fn write_lines(rx: Receiver<Record>, path: Option<String>) {
    let mut sink: Box<dyn Write> = match &path {
        Some(p) => match std::fs::OpenOptions::new().create(true).append(true).open(p) {
            Ok(f) => Box::new(f),
            Err(e) => {
                tracing::error!(path = %p, error = %e, "cannot open the access log; lines go to standard output");
                Box::new(std::io::stdout())
            }
        },
        None => Box::new(std::io::stdout()),
    };
    let mut buf = Vec::with_capacity(256 * 1024);
    loop {
        std::thread::sleep(DRAIN_EVERY);
        loop {
            match rx.try_recv() {
                Ok(r) => render(&r, &mut buf),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return,
            }
            if buf.len() >= 256 * 1024 {
                let _ = sink.write_all(&buf);
                buf.clear();
            }
        }
        if !buf.is_empty() {
            let _ = sink.write_all(&buf).and_then(|()| sink.flush());
            buf.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ids_come_from_valid_traceparents_only() {
        let ok = HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(trace_id(&ok), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(trace_id(&HeaderValue::from_static("00-xyz-1-01")), None);
    }

    #[test]
    fn a_line_is_one_json_object_without_headers_or_query() {
        let req = http::Request::builder()
            .uri("/a/b?token=secret")
            .header("host", "api.example.com")
            .header("authorization", "Bearer secret")
            .header("cookie", "session=secret")
            .header("x-request-id", "r1")
            .body(())
            .unwrap();
        let facts = RequestFacts::of(&req, false);
        let r = Record {
            time: SystemTime::UNIX_EPOCH,
            listener: "https".into(),
            method: facts.method,
            version: facts.version,
            uri: facts.uri,
            host: facts.host,
            include_query: facts.include_query,
            status: 200,
            bytes_sent: 12,
            request_bytes: None,
            head_ms: 1.5,
            duration_ms: 2.25,
            route: Some("all".into()),
            upstream: Some("app".into()),
            endpoint: Some(http::uri::Authority::from_static("10.0.0.1:80")),
            request_id: facts.request_id,
            traceparent: None,
            tls: Some(("TLSv1.3", false)),
            client_ip: "192.0.2.1".parse().unwrap(),
        };
        let mut out = Vec::new();
        render(&r, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
        assert!(!text.contains("secret"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["path"], "/a/b");
        assert_eq!(v["authority"], "api.example.com");
        assert_eq!(v["request_id"], "r1");
        assert_eq!(v["bytes_sent"], 12);
        assert_eq!(v["tls_version"], "TLSv1.3");
        assert_eq!(v["time"], "1970-01-01T00:00:00.000Z");
        let mut r = r;
        r.include_query = true;
        let mut out = Vec::new();
        render(&r, &mut out);
        assert!(String::from_utf8(out)
            .unwrap()
            .contains(r#""path":"/a/b?token=secret""#));
        // Credentials in an absolute URI's authority are not logged.
        r.uri = "http://alice:s3cret@api.example.com:8080/a".parse().unwrap();
        let mut out = Vec::new();
        render(&r, &mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["authority"], "api.example.com:8080");
    }
}
