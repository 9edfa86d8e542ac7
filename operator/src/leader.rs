//! Leader election on a coordination.k8s.io Lease, so two replicas can run and only one acts.
//! A small module rather than a crate: the logic is short, and owning it lets the holder stop
//! acting before its lease can expire even when the API server stops answering.
//!
//! Safety argument: every lease call is bounded in time, and the holder acts only until
//! `act_for` (⅔ of the lease) after the start of its last successful renewal. Another replica
//! takes the lease only once `lease_duration` has passed since that renewal's `renewTime`
//! (written at the same start), so the two windows never overlap. `tests::a_hung_renew_*`
//! checks it with a stalling API server.
//!
//! On shutdown, once the controllers have stopped, the holder gives the lease up (client-go's
//! `ReleaseOnCancel`): a successor takes over within one of its retries instead of waiting for
//! the lease to expire. An operator upgrade or a deleted pod used to leave fleets unattended
//! for up to `lease_duration` plus a retry.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The wall clock used for `renewTime` (replaceable in tests, where time is paused).
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// The election's timings. `act_for < lease_duration - call_timeout` keeps a slow last call
/// from stretching the holder's window.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub lease_duration: Duration,
    pub renew_every: Duration,
    pub call_timeout: Duration,
    pub act_for: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(2),
            call_timeout: Duration::from_secs(2),
            act_for: Duration::from_secs(10),
        }
    }
}

pub struct LeaderElection {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    clock: Clock,
}

/// What to do given a lease and the time: a pure decision.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it.
    Acquire,
    /// Someone else holds a live lease.
    Standby,
}

pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else { return Decision::Acquire };
    match spec.holder_identity.as_deref() {
        Some(h) if h == identity => Decision::Renew,
        None | Some("") => Decision::Acquire,
        Some(_) => {
            let renewed = spec.renew_time.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH);
            let duration = spec.lease_duration_seconds.unwrap_or(15) as i64;
            if now.as_second() > renewed.as_second() + duration {
                Decision::Acquire
            } else {
                Decision::Standby
            }
        }
    }
}

/// Publishes whether we lead, waking the watchers only when it changed (a follower retries
/// every 2 s).
fn publish(leader: &watch::Sender<bool>, leading: bool) {
    leader.send_if_modified(|current| std::mem::replace(current, leading) != leading);
}

/// The lease given up by `identity` at `now`, if `identity` holds it: no holder, expired a
/// second after `now` (what client-go writes on release). `None` when someone else holds it.
pub fn released(spec: &LeaseSpec, identity: &str, now: Timestamp) -> Option<LeaseSpec> {
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    Some(LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        ..spec.clone()
    })
}

/// A running election; [`Resign::now`] ends it, giving the lease up.
pub struct Resign {
    resign: Arc<Notify>,
    election: JoinHandle<()>,
}

impl Resign {
    /// Stops renewing and gives the lease up if this replica holds it. Call it only once this
    /// replica has stopped acting. Bounded: the attempt in flight and the release each take at
    /// most `call_timeout`.
    pub async fn now(self) {
        self.resign.notify_one();
        let _ = self.election.await;
    }
}

impl LeaderElection {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            timing: Timing::default(),
            clock: Arc::new(Timestamp::now),
        }
    }

    pub fn with_timing(mut self, timing: Timing, clock: Clock) -> Self {
        self.timing = timing;
        self.clock = clock;
        self
    }

    async fn try_once(&self, now: Timestamp) -> Result<bool, kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let decision = decide(current.as_ref().and_then(|l| l.spec.as_ref()), &self.identity, now);
        if decision == Decision::Standby {
            return Ok(false);
        }
        let mut spec = current.as_ref().and_then(|l| l.spec.clone()).unwrap_or_default();
        if decision == Decision::Acquire {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(self.timing.lease_duration.as_secs() as i32);
        spec.renew_time = Some(MicroTime(now));
        match current {
            // replace() carries the resourceVersion: a concurrent writer makes this fail.
            Some(mut lease) => {
                lease.spec = Some(spec);
                self.api.replace(&self.name, &PostParams::default(), &lease).await?;
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await?;
            }
        }
        Ok(true)
    }

    /// One bounded attempt. While leading, the attempt also ends at `deadline`: leadership
    /// never outlives the window a successful renewal opened.
    async fn attempt(&self, leading: bool, deadline: Instant) -> Result<bool, String> {
        let bound = if leading {
            self.timing
                .call_timeout
                .min(deadline.saturating_duration_since(Instant::now()))
        } else {
            self.timing.call_timeout
        };
        match tokio::time::timeout(bound, self.try_once((self.clock)())).await {
            Ok(Ok(held)) => Ok(held),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {bound:?}")),
        }
    }

    /// Starts the election, publishing whether we are the leader to `leader`.
    pub fn spawn(self, leader: watch::Sender<bool>) -> Resign {
        let resign = Arc::new(Notify::new());
        let election = tokio::spawn(self.run(leader, resign.clone()));
        Resign { resign, election }
    }

    /// Gives the lease up if we hold it (one bounded attempt; on failure the lease expires as
    /// it always did).
    async fn release(&self) {
        let give_up = async {
            let Some(mut lease) = self.api.get_opt(&self.name).await? else {
                return Ok(false);
            };
            let Some(spec) = lease
                .spec
                .as_ref()
                .and_then(|s| released(s, &self.identity, (self.clock)()))
            else {
                return Ok(false);
            };
            lease.spec = Some(spec);
            // replace() carries the resourceVersion: a successor's write in between wins.
            self.api.replace(&self.name, &PostParams::default(), &lease).await?;
            Ok::<_, kube::Error>(true)
        };
        match tokio::time::timeout(self.timing.call_timeout, give_up).await {
            Ok(Ok(true)) => tracing::info!(identity = %self.identity, "gave the leader lease up"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "giving the lease up failed; it expires instead"),
            Err(_) => tracing::warn!("giving the lease up took too long; it expires instead"),
        }
    }

    /// Keeps trying until `resign` is notified; publishes whether we are the leader. Leadership
    /// is dropped as soon as `act_for` has passed since the start of the last successful
    /// renewal.
    async fn run(self, leader: watch::Sender<bool>, resign: Arc<Notify>) {
        let mut deadline = Instant::now();
        loop {
            let started = Instant::now();
            let leading = *leader.borrow();
            match self.attempt(leading, deadline).await {
                Ok(true) => {
                    deadline = started + self.timing.act_for;
                    if !leading {
                        tracing::info!(identity = %self.identity, "acquired leader lease");
                    }
                    publish(&leader, true);
                }
                Ok(false) => {
                    if leading {
                        tracing::warn!("lost the leader lease to another replica");
                    }
                    publish(&leader, false);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease update failed");
                    if leading && Instant::now() >= deadline {
                        tracing::warn!("could not renew the lease in time; standing down");
                        publish(&leader, false);
                    }
                }
            }
            let next = started + self.timing.renew_every;
            let wake = if *leader.borrow() { next.min(deadline) } else { next };
            // Resigning comes first: after a slow attempt the sleep is ready at once too, and
            // another renewal after the controllers stopped would only delay the handover.
            tokio::select! {
                biased;
                _ = resign.notified() => {
                    publish(&leader, false);
                    self.release().await;
                    return;
                }
                _ = tokio::time::sleep_until(wake.max(Instant::now())) => {}
            }
            if *leader.borrow() && Instant::now() >= deadline {
                tracing::warn!("lease renewal is overdue; standing down");
                publish(&leader, false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }
    }

    #[test]
    fn decisions() {
        let now = Timestamp::from_second(1000).unwrap();
        assert_eq!(decide(None, "a", now), Decision::Acquire);
        assert_eq!(decide(Some(&lease("a", 990)), "a", now), Decision::Renew);
        assert_eq!(decide(Some(&lease("b", 990)), "a", now), Decision::Standby);
        assert_eq!(decide(Some(&lease("b", 980)), "a", now), Decision::Acquire);
    }

    #[test]
    fn only_the_holder_gives_the_lease_up_and_then_anyone_may_take_it() {
        let now = Timestamp::from_second(1000).unwrap();
        assert_eq!(released(&lease("b", 990), "a", now), None);
        let given_up = released(&lease("a", 990), "a", now).expect("a holds it");
        assert_eq!(given_up.holder_identity, None);
        assert_eq!(decide(Some(&given_up), "b", now), Decision::Acquire);
    }

    /// One Lease behind a fake API server with compare-and-swap on resourceVersion, as the
    /// real one does. A replica's connection can be made to stall: its calls never answer.
    #[derive(Default)]
    struct FakeServer {
        lease: std::sync::Mutex<Option<Lease>>,
    }

    fn respond(code: u16, body: serde_json::Value) -> http::Response<kube::client::Body> {
        let bytes = serde_json::to_vec(&body).expect("json");
        http::Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(kube::client::Body::from(bytes))
            .expect("response")
    }

    fn status(code: u16, reason: &str) -> http::Response<kube::client::Body> {
        let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": reason, "reason": reason, "code": code});
        respond(code, body)
    }

    impl FakeServer {
        fn handle(&self, method: &http::Method, body: &[u8]) -> http::Response<kube::client::Body> {
            let mut stored = self.lease.lock().expect("lease");
            let version = |l: &Lease| l.metadata.resource_version.clone().unwrap_or_default();
            match *method {
                http::Method::GET => match &*stored {
                    Some(l) => respond(200, serde_json::to_value(l).expect("lease")),
                    None => status(404, "NotFound"),
                },
                http::Method::POST | http::Method::PUT => {
                    let mut incoming: Lease = serde_json::from_slice(body).expect("a lease");
                    let current = stored.as_ref().map(version);
                    let expected = (*method == http::Method::PUT).then(|| version(&incoming));
                    if current != expected {
                        return status(409, "Conflict");
                    }
                    let next = current.map_or(1, |v| v.parse::<u64>().unwrap_or(0) + 1);
                    incoming.metadata.resource_version = Some(next.to_string());
                    *stored = Some(incoming.clone());
                    respond(200, serde_json::to_value(&incoming).expect("lease"))
                }
                _ => status(405, "MethodNotAllowed"),
            }
        }
    }

    fn client(server: Arc<FakeServer>, stalled: Arc<std::sync::atomic::AtomicBool>) -> Client {
        use http_body_util::BodyExt;
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (server, stalled) = (server.clone(), stalled.clone());
            async move {
                if stalled.load(std::sync::atomic::Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                let (parts, body) = request.into_parts();
                let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                Ok::<_, std::convert::Infallible>(server.handle(&parts.method, &bytes))
            }
        });
        Client::new(service, "default")
    }

    /// A wall clock that follows tokio's (paused, auto-advancing) clock.
    fn paused_clock() -> Clock {
        let (wall, base) = (Timestamp::from_second(1_000_000).expect("time"), Instant::now());
        Arc::new(move || wall + base.elapsed())
    }

    /// Replica A leads; then its connection to the API server stalls (every call hangs). A must
    /// stand down on its own before B can take the expired lease: at no instant do both act.
    /// When A's connection comes back it finds B holding the lease and stays a follower.
    #[tokio::test(start_paused = true)]
    async fn a_hung_renew_stands_down_before_another_replica_takes_over() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let server = Arc::new(FakeServer::default());
        let stalled_a = Arc::new(AtomicBool::new(false));
        let clock = paused_clock();
        let (tx_a, mut rx_a) = watch::channel(false);
        let (tx_b, mut rx_b) = watch::channel(false);
        let a = LeaderElection::new(client(server.clone(), stalled_a.clone()), "ns", "lease", "a")
            .with_timing(Timing::default(), clock.clone());
        let _a = a.spawn(tx_a);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let b = LeaderElection::new(client(server.clone(), Default::default()), "ns", "lease", "b")
            .with_timing(Timing::default(), clock.clone());
        let _b = b.spawn(tx_b);

        let start = Instant::now();
        let (mut a_stood_down, mut b_took_over) = (None, None);
        while start.elapsed() < Duration::from_secs(120) {
            if start.elapsed() >= Duration::from_secs(20) && a_stood_down.is_none() {
                stalled_a.store(true, Ordering::SeqCst);
            }
            if start.elapsed() >= Duration::from_secs(60) {
                stalled_a.store(false, Ordering::SeqCst);
            }
            let (leading_a, leading_b) = (*rx_a.borrow(), *rx_b.borrow());
            assert!(!(leading_a && leading_b), "two leaders at {:?}", start.elapsed());
            if start.elapsed() < Duration::from_secs(20) {
                assert!(leading_a && !leading_b, "A leads until its connection stalls");
            }
            if start.elapsed() >= Duration::from_secs(20) && !leading_a && a_stood_down.is_none() {
                a_stood_down = Some(start.elapsed());
            }
            if leading_b && b_took_over.is_none() {
                b_took_over = Some(start.elapsed());
            }
            tokio::select! {
                _ = rx_a.changed() => {}
                _ = rx_b.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        let (down, up) = (a_stood_down.expect("A stood down"), b_took_over.expect("B took over"));
        assert!(down < up, "A stood down at {down:?}, B took over at {up:?}");
        assert!(
            down <= Duration::from_secs(32),
            "A stood down within its window: {down:?}"
        );
        assert!(
            *rx_b.borrow() && !*rx_a.borrow(),
            "B leads, A follows after reconnecting"
        );
    }

    /// A replica named `name` on `server` (its connection stalls while `stalled`), running.
    fn replica(
        server: &Arc<FakeServer>,
        stalled: &Arc<std::sync::atomic::AtomicBool>,
        clock: &Clock,
        name: &str,
        leader: watch::Sender<bool>,
    ) -> Resign {
        LeaderElection::new(client(server.clone(), stalled.clone()), "ns", "lease", name)
            .with_timing(Timing::default(), clock.clone())
            .spawn(leader)
    }

    /// A leads and B stands by; A resigns (a deleted pod, an upgrade): B leads within one of its
    /// retries, not after the lease's 15 s, and A's election has ended (it never takes the
    /// lease back).
    #[tokio::test(start_paused = true)]
    async fn a_resigning_leader_hands_over_at_once() {
        let server = Arc::new(FakeServer::default());
        let clock = paused_clock();
        let (tx_a, rx_a) = watch::channel(false);
        let (tx_b, mut rx_b) = watch::channel(false);
        let a = replica(&server, &Default::default(), &clock, "a", tx_a);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _b = replica(&server, &Default::default(), &clock, "b", tx_b);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(*rx_a.borrow() && !*rx_b.borrow(), "A leads, B stands by");

        let resigned = Instant::now();
        a.now().await;
        assert!(!*rx_a.borrow(), "A no longer leads once it resigned");
        tokio::time::timeout(Duration::from_secs(60), rx_b.wait_for(|leading| *leading))
            .await
            .expect("B took over")
            .expect("B's election runs");
        let took = resigned.elapsed();
        assert!(took <= Duration::from_secs(3), "B took over {took:?} after A resigned");
        let holder = server
            .lease
            .lock()
            .expect("lease")
            .as_ref()
            .and_then(|l| l.spec.clone());
        assert_eq!(holder.and_then(|s| s.holder_identity).as_deref(), Some("b"));
    }

    /// Resigning is bounded even when the API server stops answering (the renewal in flight and
    /// the release are each cut at `call_timeout`), so it fits the pod's grace period; a
    /// follower resigns too, and leaves the holder's lease alone.
    #[tokio::test(start_paused = true)]
    async fn resigning_is_bounded_and_leaves_another_holders_lease_alone() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let server = Arc::new(FakeServer::default());
        let clock = paused_clock();
        let stalled_a = Arc::new(AtomicBool::new(false));
        let (tx_a, rx_a) = watch::channel(false);
        let (tx_b, rx_b) = watch::channel(false);
        let a = replica(&server, &stalled_a, &clock, "a", tx_a);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let b = replica(&server, &Default::default(), &clock, "b", tx_b);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(*rx_a.borrow() && !*rx_b.borrow());

        b.now().await;
        let holder = || {
            server
                .lease
                .lock()
                .expect("lease")
                .as_ref()
                .and_then(|l| l.spec.clone()?.holder_identity)
        };
        assert_eq!(
            holder().as_deref(),
            Some("a"),
            "a follower's resignation leaves the lease alone"
        );

        stalled_a.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2100)).await; // a renewal is in flight, hung
        let resigned = Instant::now();
        a.now().await;
        let took = resigned.elapsed();
        assert!(
            took <= Duration::from_secs(4),
            "resigning took {took:?} against a hung API server"
        );
        assert!(!*rx_a.borrow());
    }
}
