//! Kubernetes Events (`events.k8s.io/v1`), with repeats counted as a series.
//!
//! Why not kube-runtime's `Recorder`: it keys a series by object, type, reason and action, not
//! by the note. A second event of the same reason within its six-minute window with a new
//! message ("revision B starts in wave first" after "revision A …", a canary aborted for a
//! new reason) only raised the first Event's count, and `kubectl describe` kept showing the
//! first message: the user read the wrong reason. It also kept every Event object it
//! published until its next publish (5.9 MiB at 1 000 fleets, issue 24). Here a series is one
//! object + type + reason + note, and what is kept per series is its Event's name, count and
//! last time: about a hundred bytes, dropped once the series window has passed.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::Client;

/// The API server refuses an Event whose note is longer than this many bytes.
const NOTE_LIMIT: usize = 1024;

/// `note` cut to what the API server accepts (bytes, on a character boundary): an over-long
/// note would lose the whole event.
pub fn within_note_limit(note: &str) -> &str {
    if note.len() <= NOTE_LIMIT {
        return note;
    }
    let mut end = NOTE_LIMIT;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    &note[..end]
}

/// How long a repeat joins its series (kube-runtime's and client-go's window).
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// A series as far as we need it: its Event's name (none while its creation is in flight), how
/// often it happened, when last, and whether a request for it (the create or a count) is in
/// flight. One publish at a time sends for a series; repeats meanwhile are booked and sent by
/// it after its request, so the counts reach the API server in order and none is lost.
struct Series {
    name: Option<String>,
    count: i32,
    last: Instant,
    sending: bool,
}

type Book = Mutex<HashMap<u64, Series>>;

pub struct Events {
    client: Client,
    reporter: Reporter,
    series: Arc<Book>,
}

/// One series: the object, type, reason, action, related object and note.
fn series_key(ev: &Event, reference: &ObjectReference) -> u64 {
    let mut h = DefaultHasher::new();
    for part in [&reference.uid, &reference.namespace, &reference.name, &reference.kind] {
        part.hash(&mut h);
    }
    matches!(ev.type_, EventType::Warning).hash(&mut h);
    (&ev.reason, &ev.action, &ev.note).hash(&mut h);
    ev.secondary.as_ref().map(|s| (&s.uid, &s.name)).hash(&mut h);
    h.finish()
}

/// What to send: a new Event, the next count of an existing one, or nothing (another publish
/// is sending for the series and sends this occurrence's count after its own request).
#[derive(Debug, PartialEq)]
enum Publish {
    Create,
    Repeat { name: String, count: i32 },
    Pending,
}

/// Pure: books the event under `key` at `now`, forgetting series past the window. A new series
/// is booked at once, so a second publish of it before its Event exists counts on it instead
/// of creating another Event; a repeat while a count is in flight is sent after it.
fn book(series: &mut HashMap<u64, Series>, key: u64, now: Instant) -> Publish {
    series.retain(|_, s| now.duration_since(s.last) < SERIES_WINDOW);
    match series.get_mut(&key) {
        Some(s) => {
            s.count += 1;
            s.last = now;
            match &s.name {
                Some(name) if !s.sending => {
                    s.sending = true;
                    Publish::Repeat {
                        name: name.clone(),
                        count: s.count,
                    }
                }
                _ => Publish::Pending,
            }
        }
        None => {
            series.insert(
                key,
                Series {
                    name: None,
                    count: 1,
                    last: now,
                    sending: true,
                },
            );
            Publish::Create
        }
    }
}

/// Pure: the sender's request reached the API server with `count`; what it sends next, if
/// repeats were booked meanwhile, or nothing (the series is free for the next repeat).
fn sent(series: &mut HashMap<u64, Series>, key: u64, count: i32) -> Publish {
    let Some(s) = series.get_mut(&key) else {
        return Publish::Pending;
    };
    match &s.name {
        Some(name) if s.count > count => Publish::Repeat {
            name: name.clone(),
            count: s.count,
        },
        _ => {
            s.sending = false;
            Publish::Pending
        }
    }
}

/// Pure: the series' Event `name` was created (with a count of one).
fn created(series: &mut HashMap<u64, Series>, key: u64, name: String) -> Publish {
    match series.get_mut(&key) {
        Some(s) => {
            s.name = Some(name);
            sent(series, key, 1)
        }
        None => Publish::Pending,
    }
}

/// Pure: the sender's request failed without an answer that settles it: the series is free,
/// and its booked count goes with the next repeat. `name` is the Event a create that may
/// have succeeded chose (repeats count on it; if it does not exist, their 404 restarts it).
fn unsettled(series: &mut HashMap<u64, Series>, key: u64, name: Option<String>) {
    if let Some(s) = series.get_mut(&key) {
        s.sending = false;
        if name.is_some() {
            s.name = name;
        }
    }
}

/// Pure: the series' Event `gone` no longer exists (expired, deleted) when its count `count`
/// was sent. The series starts again: the sender creates a new Event for this occurrence,
/// which counts the repeats booked since as well.
fn restart(series: &mut HashMap<u64, Series>, key: u64, gone: &str, count: i32, now: Instant) -> Publish {
    match series.get_mut(&key) {
        Some(s) if s.name.as_deref() == Some(gone) => {
            s.name = None;
            s.count = (s.count - count + 1).max(1);
            s.last = now;
            Publish::Create
        }
        Some(s) => {
            s.sending = false;
            Publish::Pending
        }
        None => book(series, key, now),
    }
}

impl Events {
    /// A publisher, and a task that forgets series past their window (it ends with the
    /// publisher), so a quiet operator keeps none.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        let series: Arc<Book> = Arc::default();
        tokio::spawn(forget_old(Arc::downgrade(&series)));
        Self {
            client,
            reporter,
            series,
        }
    }

    pub async fn publish(&self, ev: &Event, reference: &ObjectReference) -> Result<(), kube::Error> {
        let key = series_key(ev, reference);
        let now = Instant::now();
        let namespace = reference.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let mut step = self.booked(|s| book(s, key, now)).unwrap_or(Publish::Create);
        loop {
            step = match step {
                Publish::Pending => return Ok(()),
                Publish::Create => self.create(&api, ev, reference, key).await?,
                Publish::Repeat { name, count } => match count_on(&api, &name, count).await {
                    Ok(()) => self.booked(|s| sent(s, key, count)).unwrap_or(Publish::Pending),
                    Err(kube::Error::Api(e)) if e.code == 404 => self
                        .booked(|s| restart(s, key, &name, count, now))
                        .unwrap_or(Publish::Pending),
                    Err(e) => {
                        self.booked(|s| unsettled(s, key, None));
                        return Err(e);
                    }
                },
            };
        }
    }

    /// Creates the series' Event; what to send next for it.
    async fn create(
        &self,
        api: &Api<K8sEvent>,
        ev: &Event,
        reference: &ObjectReference,
        key: u64,
    ) -> Result<Publish, kube::Error> {
        let stamp = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let event = self.event(ev, reference, stamp);
        match api.create(&PostParams::default(), &event).await {
            Ok(K8sEvent {
                metadata: ObjectMeta { name: Some(name), .. },
                ..
            }) => Ok(self.booked(|s| created(s, key, name)).unwrap_or(Publish::Pending)),
            Ok(_) => {
                self.forget_unnamed(key);
                Ok(Publish::Pending)
            }
            Err(e) => {
                match (maybe_created(&e), event.metadata.name) {
                    // The Event may exist under the name we chose: repeats count on it, and if
                    // it does not, the first repeat's 404 starts the series again.
                    (true, Some(name)) => {
                        self.booked(|s| unsettled(s, key, Some(name)));
                    }
                    _ => self.forget_unnamed(key),
                }
                Err(e)
            }
        }
    }

    /// Runs a pure step on the book of series.
    fn booked<T>(&self, step: impl FnOnce(&mut HashMap<u64, Series>) -> T) -> Option<T> {
        self.series.lock().ok().map(|mut s| step(&mut s))
    }

    /// A series whose Event could not be created is forgotten, so the next publish tries again
    /// (repeats counted while it was being created are lost with it).
    fn forget_unnamed(&self, key: u64) {
        if let Ok(mut s) = self.series.lock() {
            if s.get(&key).is_some_and(|s| s.name.is_none()) {
                s.remove(&key);
            }
        }
    }

    fn event(&self, ev: &Event, reference: &ObjectReference, stamp: MicroTime) -> K8sEvent {
        let object = reference.name.as_deref().unwrap_or(&self.reporter.controller);
        K8sEvent {
            metadata: ObjectMeta {
                name: Some(format!("{object}.{:x}", stamp.0.as_nanosecond())),
                namespace: reference.namespace.clone(),
                ..Default::default()
            },
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            note: ev.note.clone(),
            event_time: Some(stamp),
            regarding: Some(reference.clone()),
            related: ev.secondary.clone(),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            type_: Some(match ev.type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            ..Default::default()
        }
    }
}

/// Whether a failed create may still have created the Event: the request may have reached the
/// API server (no answer, a timeout, a server error), or the name exists already. A refusal
/// (any other 4xx) created nothing.
fn maybe_created(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 409 || status.code >= 500,
        _ => true,
    }
}

/// Sets the count of the series' Event `name`.
async fn count_on(api: &Api<K8sEvent>, name: &str, count: i32) -> Result<(), kube::Error> {
    let stamp = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let patch = serde_json::json!({"series": EventSeries { count, last_observed_time: stamp }});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

async fn forget_old(series: Weak<Book>) {
    let mut tick = tokio::time::interval(SERIES_WINDOW / 6);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(held) = series.upgrade() else { return };
        let Ok(mut s) = held.lock() else { return };
        let now = Instant::now();
        s.retain(|_, s| now.duration_since(s.last) < SERIES_WINDOW);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::client::Body;

    fn event(reason: &str, note: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Reconcile".into(),
            secondary: None,
        }
    }

    fn fleet() -> ObjectReference {
        ObjectReference {
            kind: Some("ProxyDeployment".into()),
            name: Some("demo".into()),
            namespace: Some("team-a".into()),
            uid: Some("u-1".into()),
            ..Default::default()
        }
    }

    type Handle = tower_test::mock::Handle<http::Request<Body>, http::Response<Body>>;
    type Reply = tower_test::mock::SendResponse<http::Response<Body>>;

    /// A publisher whose API server is the returned mock.
    fn mocked_events() -> (Events, Handle) {
        let (mock, handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let reporter = Reporter {
            controller: "proxyfleet-operator".into(),
            instance: None,
        };
        (Events::new(kube::Client::new(mock, "default"), reporter), handle)
    }

    /// What the mocked API server was sent.
    struct Seen {
        method: http::Method,
        path: String,
        content_type: Option<String>,
        body: serde_json::Value,
    }

    /// The mock's next request, and where its reply goes.
    async fn next_request(handle: &mut Handle) -> (Seen, Reply) {
        let (request, send) = handle.next_request().await.expect("a request");
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let content_type = request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = http_body_util::BodyExt::collect(request.into_body())
            .await
            .expect("body")
            .to_bytes();
        let body = serde_json::from_slice(&bytes).expect("json");
        let seen = Seen {
            method,
            path,
            content_type,
            body,
        };
        (seen, send)
    }

    /// Replies with `body` as the Event named `name`.
    fn reply_event(send: Reply, mut body: serde_json::Value, name: &str) {
        body["apiVersion"] = serde_json::json!("events.k8s.io/v1");
        body["kind"] = serde_json::json!("Event");
        body["metadata"] = serde_json::json!({ "name": name });
        let reply = serde_json::to_vec(&body).expect("json");
        send.send_response(http::Response::builder().body(Body::from(reply)).expect("response"));
    }

    #[test]
    fn a_note_is_cut_to_the_api_servers_limit_in_bytes() {
        assert_eq!(within_note_limit("short"), "short");
        let wide = "é".repeat(1000);
        let cut = within_note_limit(&wide);
        assert!(cut.len() <= NOTE_LIMIT && cut.len() >= NOTE_LIMIT - 1);
        assert!(wide.starts_with(cut));
    }

    #[test]
    fn a_series_is_one_note_and_ends_after_its_window() {
        let (r, start) = (fleet(), Instant::now());
        let a = series_key(&event("WaveRolloutStarted", "revision a starts"), &r);
        let b = series_key(&event("WaveRolloutStarted", "revision b starts"), &r);
        assert_ne!(a, b, "a new message is a new series, not a count on the old one");
        let mut book_ = HashMap::new();
        assert_eq!(book(&mut book_, a, start), Publish::Create);
        assert_eq!(created(&mut book_, a, "demo.1".into()), Publish::Pending);
        let repeat = book(&mut book_, a, start + Duration::from_secs(60));
        assert_eq!(
            repeat,
            Publish::Repeat {
                name: "demo.1".into(),
                count: 2
            }
        );
        assert_eq!(book(&mut book_, b, start), Publish::Create);
        let later = start + Duration::from_secs(60) + SERIES_WINDOW;
        assert_eq!(book(&mut book_, a, later), Publish::Create, "past the window");
        assert_eq!(
            book_.len(),
            1,
            "only the series just booked: the others ended with their window"
        );
    }

    /// Two publishes of a new series at once make one Event: the second is counted while the
    /// first is created, and the creator sends the count. A repeat while a count is in flight
    /// is sent after it by its sender, so counts never go backwards; a re-created Event counts
    /// the repeats booked since its old one was last counted.
    #[test]
    fn one_publish_sends_for_a_series_at_a_time_and_sends_what_was_booked_meanwhile() {
        let (r, now) = (fleet(), Instant::now());
        let a = series_key(&event("CanaryAborted", "P99 above 250 ms"), &r);
        let mut book_ = HashMap::new();
        let repeat = |name: &str, count| Publish::Repeat {
            name: name.into(),
            count,
        };
        assert_eq!(book(&mut book_, a, now), Publish::Create);
        assert_eq!(book(&mut book_, a, now), Publish::Pending, "not a second Event");
        assert_eq!(created(&mut book_, a, "demo.1".into()), repeat("demo.1", 2));
        assert_eq!(sent(&mut book_, a, 2), Publish::Pending, "nothing more booked: free");
        assert_eq!(book(&mut book_, a, now), repeat("demo.1", 3));
        assert_eq!(book(&mut book_, a, now), Publish::Pending, "3 is in flight");
        assert_eq!(
            sent(&mut book_, a, 3),
            repeat("demo.1", 4),
            "its sender sends 4 after 3"
        );
        assert_eq!(book(&mut book_, a, now), Publish::Pending, "4 is in flight");
        // demo.1 is gone when 4 is sent: a new Event counts the 4th and the 5th.
        assert_eq!(restart(&mut book_, a, "demo.1", 4, now), Publish::Create);
        assert_eq!(book(&mut book_, a, now), Publish::Pending, "while it is created");
        assert_eq!(created(&mut book_, a, "demo.2".into()), repeat("demo.2", 3));
        assert_eq!(sent(&mut book_, a, 3), Publish::Pending);
        assert_eq!(book(&mut book_, a, now), repeat("demo.2", 4));
        // A count that failed leaves the series free; the next repeat carries it.
        unsettled(&mut book_, a, None);
        assert_eq!(book(&mut book_, a, now), repeat("demo.2", 5));
    }

    /// Against a mocked API server: the first event is created, its repeat counts on it, a new
    /// note is an Event of its own.
    #[tokio::test]
    async fn repeats_count_on_their_event_new_notes_get_their_own() {
        let (events, mut handle) = mocked_events();
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..3 {
                let (request, send) = next_request(&mut handle).await;
                let (expected, name) = match request.method {
                    http::Method::POST => (
                        "/apis/events.k8s.io/v1/namespaces/team-a/events",
                        format!("demo.{}", seen.len()),
                    ),
                    _ => {
                        assert_eq!(request.content_type.as_deref(), Some("application/merge-patch+json"));
                        (
                            "/apis/events.k8s.io/v1/namespaces/team-a/events/demo.0",
                            "demo.0".into(),
                        )
                    }
                };
                assert_eq!(request.path, expected);
                reply_event(send, request.body.clone(), &name);
                seen.push((request.method, request.body));
            }
            seen
        });
        for note in ["revision a starts", "revision a starts", "revision b starts"] {
            events
                .publish(&event("WaveRolloutStarted", note), &fleet())
                .await
                .expect("published");
        }
        let seen = server.await.expect("mock server");
        assert_eq!(seen[0].0, http::Method::POST);
        assert_eq!(seen[0].1["note"], "revision a starts");
        assert_eq!(seen[1].0, http::Method::PATCH);
        assert_eq!(seen[1].1["series"]["count"], 2);
        assert_eq!(seen[2].0, http::Method::POST, "a new note is a new Event");
        assert_eq!(seen[2].1["note"], "revision b starts");
    }

    /// Against a mocked API server: two publishes of a new series at the same time make one
    /// Event, then its count of 2.
    #[tokio::test]
    async fn simultaneous_publishes_make_one_event() {
        let (events, mut handle) = mocked_events();
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..2 {
                let (request, send) = next_request(&mut handle).await;
                reply_event(send, request.body.clone(), "demo.0");
                seen.push((request.method, request.body));
            }
            seen
        });
        let ev = event("CanaryAborted", "P99 above 250 ms");
        let r = fleet();
        let (a, b) = tokio::join!(events.publish(&ev, &r), events.publish(&ev, &r));
        a.expect("published");
        b.expect("published");
        let seen = server.await.expect("mock server");
        assert_eq!(seen[0].0, http::Method::POST);
        assert_eq!(seen[1].0, http::Method::PATCH, "the second is a count, not an Event");
        assert_eq!(seen[1].1["series"]["count"], 2);
    }

    /// Against a mocked API server: repeats published while a count is in flight do not race
    /// it; the counts arrive in order, the last one last.
    #[tokio::test]
    async fn repeats_at_once_reach_the_api_server_in_order() {
        let (events, mut handle) = mocked_events();
        let server = tokio::spawn(async move {
            let mut counts = Vec::new();
            for _ in 0..3 {
                let (request, send) = next_request(&mut handle).await;
                counts.push(request.body["series"]["count"].as_i64().unwrap_or(1));
                reply_event(send, request.body.clone(), "demo.0");
            }
            counts
        });
        let ev = event("ApplyFailed", "quota exceeded");
        let r = fleet();
        events.publish(&ev, &r).await.expect("created");
        let (a, b, c) = tokio::join!(
            events.publish(&ev, &r),
            events.publish(&ev, &r),
            events.publish(&ev, &r)
        );
        for done in [a, b, c] {
            done.expect("published");
        }
        let counts = server.await.expect("mock server");
        assert_eq!(
            counts,
            [1, 2, 4],
            "2 sent at once, 3 and 4 booked meanwhile and sent after it as 4"
        );
    }

    fn status(code: u16) -> Body {
        let status = serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
            "reason": "Timeout", "message": "m", "code": code});
        Body::from(serde_json::to_vec(&status).expect("json"))
    }

    /// A create that timed out may have made the Event: the next occurrence counts on the name
    /// it was created with instead of making a second Event. A refused create made nothing:
    /// the next occurrence creates it.
    #[tokio::test]
    async fn after_an_unanswered_create_a_repeat_counts_on_its_name_after_a_refusal_it_creates() {
        let (events, mut handle) = mocked_events();
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for code in [504u16, 200, 422, 200] {
                let (request, send) = next_request(&mut handle).await;
                let body = request.body.clone();
                seen.push(request);
                if code == 200 {
                    let name = body["metadata"]["name"].as_str().unwrap_or("patched").to_string();
                    reply_event(send, body, &name);
                } else {
                    send.send_response(
                        http::Response::builder()
                            .status(code)
                            .body(status(code))
                            .expect("response"),
                    );
                }
            }
            seen
        });
        let timed_out = event("ApplyFailed", "slow");
        assert!(events.publish(&timed_out, &fleet()).await.is_err());
        events.publish(&timed_out, &fleet()).await.expect("counted");
        let refused = event("ApplyFailed", "refused");
        assert!(events.publish(&refused, &fleet()).await.is_err());
        events.publish(&refused, &fleet()).await.expect("created");
        let seen = server.await.expect("mock server");
        let first_name = seen[0].body["metadata"]["name"]
            .as_str()
            .expect("a chosen name")
            .to_string();
        let calls: Vec<_> = seen.iter().map(|r| r.method.as_str()).collect();
        assert_eq!(calls, ["POST", "PATCH", "POST", "POST"]);
        assert!(
            seen[1].path.ends_with(&format!("/events/{first_name}")),
            "{}",
            seen[1].path
        );
        assert_eq!(seen[1].body["series"]["count"], 2);
    }

    /// Against a mocked API server: a repeat whose Event has expired (the count's PATCH gets
    /// 404) creates it again, and the next repeat counts on the new one.
    #[tokio::test]
    async fn a_repeat_of_an_expired_event_creates_it_again() {
        let (events, mut handle) = mocked_events();
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for i in 0..4 {
                let (request, send) = next_request(&mut handle).await;
                let body = request.body.clone();
                seen.push(request);
                if i == 1 {
                    let gone = serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                        "reason": "NotFound", "message": "events \"demo.0\" not found", "code": 404});
                    let reply = Body::from(serde_json::to_vec(&gone).expect("json"));
                    send.send_response(http::Response::builder().status(404).body(reply).expect("response"));
                } else {
                    reply_event(send, body, if i < 2 { "demo.0" } else { "demo.1" });
                }
            }
            seen
        });
        let ev = event("CertificateRenewed", "leaf renewed");
        for _ in 0..3 {
            events.publish(&ev, &fleet()).await.expect("published");
        }
        let seen = server.await.expect("mock server");
        let calls: Vec<_> = seen
            .iter()
            .map(|r| (r.method.as_str(), r.path.rsplit('/').next().unwrap_or_default()))
            .collect();
        assert_eq!(
            calls,
            [
                ("POST", "events"),
                ("PATCH", "demo.0"),
                ("POST", "events"),
                ("PATCH", "demo.1")
            ],
            "created, its count refused as gone, created again, then counted on the new one"
        );
        assert_eq!(seen[2].body["note"], "leaf renewed");
        assert_eq!(
            seen[3].body["series"]["count"], 2,
            "the new Event's series starts again"
        );
    }
}
