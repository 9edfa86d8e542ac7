//! The request path, in phases: request filter → route → fault → upstream (with retries) →
//! response filter → metrics.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::Body as _;
use tracing::Instrument;

use crate::access_log::{Destination, ListenerLog, LogWanted, PendingLog, RequestFacts};
use crate::body::{self, BodyState, BodyWatch, ClientBody, RequestBody, UpstreamBody};
pub use crate::forwarding::ClientInfo;
use crate::forwarding::{append_forwarded, client_response, header_has_token, status_response, strip_hop_by_hop};
use crate::metrics::RouteMetrics;
use crate::request_path::PathError;
use crate::router::{self, CompiledRoute, Target};
use crate::shared::Shared;
use crate::state::ProxyState;
use crate::trace_context::SpanFacts;
use crate::upstream;

fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

pub async fn handle(
    mut req: Request<RequestBody>,
    shared: Arc<Shared>,
    client: Arc<ClientInfo>,
) -> Result<Response<ClientBody>, Infallible> {
    crate::forwarding::strip_connection_options(req.headers_mut());
    let state = shared.state.load_full();
    let request_id = if state.config.forwarding.request_id {
        Some(ensure_request_id(req.headers_mut()))
    } else {
        None
    };
    let trace = state.tracer.as_ref().map(|t| (t, t.start(req.headers_mut())));
    let mut span_facts = trace
        .as_ref()
        .filter(|(t, span)| t.records(span))
        .map(|_| span_facts_of(&req, &client));
    if span_facts.is_some() {
        req.extensions_mut().insert(LogWanted);
    }
    let grpc = crate::grpc::is_grpc(&req);
    let h2 = req.version() == Version::HTTP_2;
    let mut resp = match client.access_log.clone() {
        None => handle_request(req, &shared, &state, client).await,
        Some(log) => logged(req, &shared, &state, client, &log).await,
    };
    if let (Some((tracer, span)), Some(facts)) = (trace, span_facts.as_mut()) {
        facts.status = resp.status().as_u16();
        if let Some(d) = resp.extensions().get::<Destination>() {
            (facts.route, facts.upstream, facts.endpoint) = (d.route.clone(), d.upstream.clone(), d.endpoint.clone());
        }
        tracer.finish(span, std::mem::take(facts));
    }
    if let Some(id) = request_id {
        resp.headers_mut().entry(X_REQUEST_ID).or_insert(id).set_sensitive(true);
    }
    if h2 {
        never_index_date(resp.headers_mut());
    }
    // A gRPC client gets the proxy's own failures as gRPC statuses.
    Ok(if grpc { crate::grpc::answer(resp) } else { resp })
}

/// The request's side of its span, taken before the request is consumed.
fn span_facts_of<B>(req: &Request<B>, client: &ClientInfo) -> SpanFacts {
    SpanFacts {
        method: req.method().as_str().to_string(),
        path: req.uri().path().to_string(),
        authority: router::request_host(req.uri(), req.headers()).map(str::to_string),
        client_ip: client.remote.ip().to_string(),
        ..Default::default()
    }
}

const X_REQUEST_ID: header::HeaderName = header::HeaderName::from_static("x-request-id");

/// The request's id: its own `X-Request-Id`, or a new one added to it. Marked sensitive, so
/// HTTP/2 sends it as a literal HPACK never indexes: a value unique to each request would
/// otherwise enter every connection's dynamic table, evict the entries worth keeping (`date`,
/// `content-type`, …), and cost each response a walk comparing it with the ids before it
/// (profiled: 5 % of an HTTP/2 request's CPU at one stream per connection).
fn ensure_request_id(headers: &mut HeaderMap) -> HeaderValue {
    let id = headers
        .entry(X_REQUEST_ID)
        .or_insert_with(crate::http_rules::new_request_id);
    id.set_sensitive(true);
    id.clone()
}

/// An HTTP/2 response's `Date` goes as a literal HPACK never indexes. Indexed, each second's
/// value is a new entry of the connection's dynamic table, and h2's encoder looks a value up by
/// walking every entry of the same name, oldest first: each response compared its date with
/// all the dates before it still in the table (up to ~55 in 4 KiB), so the cost grew with the
/// connection's age (profiled at one stream per connection: `memcmp` under
/// `Table::index_occupied`, 1 % of the front's CPU after 8 s). Costs ~30 bytes a response,
/// which is how nginx and HAProxy send it (they keep no dynamic table for responses).
fn never_index_date(headers: &mut HeaderMap) {
    if let Some(date) = headers.get_mut(header::DATE) {
        date.set_sensitive(true);
    }
}

/// A request on a listener with an access log: its line is written when the response body
/// is done, for sampled requests and for every 5xx.
async fn logged(
    mut req: Request<RequestBody>,
    shared: &Shared,
    state: &Arc<ProxyState>,
    client: Arc<ClientInfo>,
    log: &ListenerLog,
) -> Response<ClientBody> {
    let started = Instant::now();
    let sampled = log.sampled();
    let facts = RequestFacts::of(&req, log.include_query);
    if sampled {
        req.extensions_mut().insert(LogWanted);
    }
    let conn = (client.remote.ip(), client.tls_summary());
    let resp = handle_request(req, shared, state, client).await;
    if !sampled && !resp.status().is_server_error() {
        return resp;
    }
    let dest = resp.extensions().get::<Destination>().cloned().unwrap_or_default();
    let pending = PendingLog::new(log, facts, resp.status().as_u16(), dest, conn, started);
    resp.map(|inner| ClientBody::Logged {
        inner: Box::pin(inner),
        log: pending,
    })
}

/// Request filter, routing, then the routed phases.
async fn handle_request(
    mut req: Request<RequestBody>,
    shared: &Shared,
    state: &Arc<ProxyState>,
    client: Arc<ClientInfo>,
) -> Response<ClientBody> {
    if req.method() == Method::CONNECT && !crate::upgrade::is_extended_websocket(&req) {
        return crate::connect::handle_connect(req, shared, client).await;
    }
    let limits = &state.config.limits;
    let started = Instant::now();
    if let Err(resp) = request_filter(&mut req, limits) {
        shared.metrics.malformed_requests.inc();
        return finish(shared, None, resp, started);
    }
    if let Some(resp) = shared.acme.answer(&req) {
        return finish(shared, None, resp, started);
    }
    let host = router::request_host(req.uri(), req.headers());
    if misdirected(&client, host) {
        shared.metrics.misdirected_requests.inc();
        let resp = status_response(
            StatusCode::MISDIRECTED_REQUEST,
            "this connection's certificate does not cover the request's host\n",
        );
        return finish(shared, None, resp, started);
    }
    let Some(route) = router::select(&state.routes, host, req.uri().path(), req.headers()) else {
        return finish(
            shared,
            None,
            status_response(StatusCode::NOT_FOUND, "no route\n"),
            started,
        );
    };
    // Instrumented, never entered across an await: an entered span that outlives its task's
    // poll is the tracing-subscriber panic debug logging used to cause under load.
    let span = tracing::debug_span!("request", route = %route.name, method = %req.method(), path = %req.uri().path());
    let ctx = RequestContext {
        client,
        trusted: &state.trusted_proxies,
        body_rules: body::BodyRules {
            max_bytes: limits.max_request_body_bytes,
            read_timeout: limits.client_body_timeout(),
        },
        read_ahead: (req.version() == Version::HTTP_2).then(|| limits.send_timeout()),
        started,
    };
    routed(shared, route, req, ctx).instrument(span).await
}

/// What the phases after routing need besides the request.
struct RequestContext<'a> {
    client: Arc<ClientInfo>,
    trusted: &'a [proxyfleet_config::Cidr],
    body_rules: body::BodyRules,
    /// For an HTTP/2 client, `limits.sendTimeout`: the period in which a client that fell behind
    /// an upstream's response read ahead must take enough of it (`upstream::read_ahead`).
    read_ahead: Option<Duration>,
    started: Instant,
}

/// Checks before routing: body size, request target, Host rules; normalises the path.
fn request_filter(
    req: &mut Request<RequestBody>,
    limits: &proxyfleet_config::Limits,
) -> Result<(), Response<ClientBody>> {
    if let Some(len) = req.headers().get(header::CONTENT_LENGTH) {
        match crate::forwarding::parse_content_length(len) {
            Some(n) if n > limits.max_request_body_bytes => {
                return Err(status_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request body too large\n",
                ));
            }
            Some(_) => {}
            None => return Err(status_response(StatusCode::BAD_REQUEST, "invalid content-length\n")),
        }
    }
    if req.uri().path_and_query().is_none() || !req.uri().path().starts_with('/') {
        return Err(status_response(
            StatusCode::BAD_REQUEST,
            "request target must be an absolute path\n",
        ));
    }
    if let Some(why) = host_problem(req) {
        return Err(status_response(StatusCode::BAD_REQUEST, why));
    }
    let normalized = crate::request_path::normalized(req.uri().path(), limits.path_rules()).map_err(|e| {
        let why = match e {
            PathError::BadEscape => "malformed percent-encoding in the path\n",
            PathError::EscapedSlash => "escaped slash in the path\n",
        };
        status_response(StatusCode::BAD_REQUEST, why)
    })?;
    if let Some(path) = normalized {
        let pq = match req.uri().query() {
            Some(q) => format!("{path}?{q}"),
            None => path,
        };
        let mut parts = req.uri().clone().into_parts();
        parts.path_and_query = pq.parse().ok();
        match http::Uri::from_parts(parts) {
            Ok(uri) => *req.uri_mut() = uri,
            Err(_) => return Err(status_response(StatusCode::BAD_REQUEST, "bad request target\n")),
        }
    }
    Ok(())
}

/// RFC 9110 §7.4 (and 421 as nginx and Envoy answer it): on a TLS connection, a request for a
/// host other than the SNI name is served only when the same certificate covers it.
fn misdirected(client: &ClientInfo, host: Option<&str>) -> bool {
    let Some(tls) = &client.tls else { return false };
    match (tls.sni.as_deref(), host) {
        (Some(sni), Some(host)) => !host.eq_ignore_ascii_case(sni) && !tls.certs.covers(sni, host),
        _ => false,
    }
}

/// 429 with the seconds until a token is there (at least 1, as Retry-After counts whole seconds).
fn too_many_requests(wait: std::time::Duration) -> Response<ClientBody> {
    let mut r = status_response(StatusCode::TOO_MANY_REQUESTS, "rate limit exceeded\n");
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    r
}

/// RFC 9112 §3.2: an HTTP/1.1 request needs exactly one Host; two are refused, not both
/// forwarded (routing confusion, cache poisoning). HTTP/2 and /3 carry `:authority` instead.
fn host_problem<B>(req: &Request<B>) -> Option<&'static str> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let first = hosts.next();
    if hosts.next().is_some() {
        return Some("more than one Host header\n");
    }
    if req.version() == Version::HTTP_11 && first.is_none() && req.uri().authority().is_none() {
        return Some("an HTTP/1.1 request needs a Host header\n");
    }
    // A Host beside a differing `:authority` (HTTP/2) or absolute-form target (HTTP/1.1) is
    // normalised, not refused: the authority wins for routing and `forward` sends it as the
    // Host (RFC 9112 §3.2.2; RFC 9113 §8.3.1 only says SHOULD treat it as malformed, and
    // proxies that send the endpoint as `:authority` with the client's Host are common).
    None
}

/// The phases after routing: fault injection, then the upstream.
async fn routed(
    shared: &Shared,
    route: &CompiledRoute,
    mut req: Request<RequestBody>,
    ctx: RequestContext<'_>,
) -> Response<ClientBody> {
    let RequestContext {
        client,
        trusted,
        body_rules,
        read_ahead,
        started,
    } = ctx;
    let log_wanted = req.extensions().get::<LogWanted>().is_some();
    let backend = route.backend(req.headers());
    let metrics = Some(&backend.metrics);
    let refused = route.refused.as_ref().unwrap_or(&backend.metrics);
    let admitted = match crate::route_auth::admit(route, &mut req) {
        Ok(a) => a,
        Err(resp) => return finish(shared, Some(refused), resp, started),
    };
    if let Some(limiter) = &route.rate_limit {
        if let Err(wait) = limiter.check(req.headers(), client.remote.ip(), started) {
            refused.rate_limited.inc();
            return finish(shared, Some(refused), too_many_requests(wait), started);
        }
    }
    // Fault injection. The route timeout and the upstream latency sample start after an
    // injected delay: the delay is not the upstream's.
    let mut upstream_started = started;
    if let Some(fault) = &route.fault {
        if let Some(d) = &fault.delay {
            if d.percent > 0.0 && fastrand::f64() * 100.0 < d.percent {
                backend.metrics.fault_delay.inc();
                tokio::time::sleep(d.duration.get()).await;
                upstream_started = Instant::now();
            }
        }
        if let Some(a) = &fault.abort {
            if a.percent > 0.0 && fastrand::f64() * 100.0 < a.percent {
                backend.metrics.fault_abort.inc();
                let status = StatusCode::from_u16(a.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
                return finish(shared, metrics, status_response(status, "fault injected\n"), started);
            }
        }
    }
    let target = Target { route, backend };
    let mut resp = if is_websocket_upgrade(&req) {
        crate::upgrade::tunnel(target, req, (client, trusted), upstream_started, read_ahead).await
    } else if let Some(t) = route.transcoder.as_ref().filter(|_| !crate::grpc::is_grpc(&req)) {
        match t.prepare(req, body_rules).await {
            Ok((grpc, call)) => {
                let resp = forward(target, grpc, &client, trusted, body_rules, upstream_started).await;
                call.respond(resp, read_ahead).await
            }
            Err(resp) => resp,
        }
    } else {
        let cut = read_ahead.and_then(|_| stream_cut(&mut req));
        let resp = forward(target, req, &client, trusted, body_rules, upstream_started).await;
        body::ahead_of_client(resp, read_ahead, cut)
    };
    if let Some(ops) = &route.response_headers {
        ops.apply(resp.headers_mut());
    }
    crate::route_auth::decorate(route, &admitted, &mut resp);
    if log_wanted {
        let dest = resp.extensions_mut().get_or_insert_default::<Destination>();
        dest.route = Some(route.name.clone());
        dest.upstream = Some(backend.upstream.name.clone());
    }
    finish(shared, metrics, resp, started)
}

/// An HTTP/1.1 WebSocket handshake: `Connection: upgrade` and `Upgrade: websocket`. Other
/// upgrades (h2c) are not passed on: they are stripped as hop-by-hop like any other.
/// An HTTP/1.1 WebSocket upgrade, or an HTTP/2 extended CONNECT for one (RFC 8441).
fn is_websocket_upgrade<B>(req: &Request<B>) -> bool {
    (req.version() == Version::HTTP_11
        && req.method() == http::Method::GET
        && header_has_token(req.headers(), &header::CONNECTION, "upgrade")
        && header_has_token(req.headers(), &header::UPGRADE, "websocket"))
        || crate::upgrade::is_extended_websocket(req)
}

fn finish(
    shared: &Shared,
    metrics: Option<&RouteMetrics>,
    resp: Response<ClientBody>,
    started: Instant,
) -> Response<ClientBody> {
    let secs = started.elapsed().as_secs_f64();
    metrics
        .unwrap_or(&shared.no_route_metrics)
        .observe(resp.status().as_u16(), secs);
    resp
}

/// Copies a sampled request to the mirror and returns the body the real request sends: a small
/// sized body is read whole first so both copies can send it; any other body streams as usual
/// and is not mirrored.
async fn mirrored(
    mirror: &crate::mirror::CompiledMirror,
    parts: &http::request::Parts,
    incoming: RequestBody,
    body_rules: body::BodyRules,
) -> Result<UpstreamBody, Response<ClientBody>> {
    use http_body_util::BodyExt;
    if incoming.is_end_stream() {
        mirror.copy(parts, bytes::Bytes::new());
        return Ok(UpstreamBody::Empty);
    }
    let small = incoming
        .size_hint()
        .exact()
        .is_some_and(|n| n <= crate::mirror::MAX_BODY.min(body_rules.max_bytes));
    if !small {
        mirror.skip();
        return Ok(UpstreamBody::streaming(incoming, body_rules));
    }
    // Timed between reads as a streamed body is: a client that stalls is cut off.
    let rules = body::BodyRules {
        max_bytes: crate::mirror::MAX_BODY.min(body_rules.max_bytes),
        ..body_rules
    };
    match UpstreamBody::streaming(incoming, rules).collect().await {
        Ok(collected) => {
            let data = collected.to_bytes();
            mirror.copy(parts, data.clone());
            Ok(UpstreamBody::Buffered { data: Some(data) })
        }
        Err(e) if e.is::<body::BodyTimedOut>() => Err(status_response(
            StatusCode::REQUEST_TIMEOUT,
            "the request body stalled\n",
        )),
        Err(_) => Err(status_response(StatusCode::BAD_REQUEST, "malformed request body\n")),
    }
}

/// For a request whose body streams: the cut its upstream body watches, in its extensions for
/// `attempts`, so the upstream stream ends when its response is given up.
fn stream_cut(req: &mut Request<RequestBody>) -> Option<upstream::StreamCut> {
    if req.body().is_end_stream() {
        return None;
    }
    let cut = upstream::StreamCut::default();
    req.extensions_mut().insert(cut.clone());
    Some(cut)
}

enum Attempt {
    Done(upstream::UpstreamResponse),
    /// Failed in a way that may be retried (connect failure or 502/503/504).
    Retryable(Response<ClientBody>),
    Final(Response<ClientBody>),
}

async fn forward(
    target: Target<'_>,
    req: Request<RequestBody>,
    client: &ClientInfo,
    trusted: &[proxyfleet_config::Cidr],
    body_rules: body::BodyRules,
    started: Instant,
) -> Response<ClientBody> {
    let log_wanted = req.extensions().get::<LogWanted>().is_some();
    let mut last_endpoint: Option<http::uri::Authority> = None;
    let mut resp = attempts(target, req, client, trusted, body_rules, started, &mut last_endpoint).await;
    if log_wanted {
        resp.extensions_mut().insert(Destination {
            endpoint: last_endpoint,
            ..Default::default()
        });
    }
    resp
}

/// The first attempt and any retries.
async fn attempts(
    target: Target<'_>,
    req: Request<RequestBody>,
    client: &ClientInfo,
    trusted: &[proxyfleet_config::Cidr],
    body_rules: body::BodyRules,
    started: Instant,
    last_endpoint: &mut Option<http::uri::Authority>,
) -> Response<ClientBody> {
    let route = target.route;
    let (mut parts, incoming) = req.into_parts();
    route.retry_budget.on_request();
    let retryable = route.retry_attempts > 0 && is_idempotent(&parts.method) && incoming.is_end_stream();
    // The target's authority is the Host (h2 `:authority`; an HTTP/1.1 absolute-form target,
    // which wins over its Host header, RFC 9112 §3.2.2), so routing and upstream agree.
    if let Some(a) = parts.uri.authority() {
        if let Ok(v) = HeaderValue::from_str(a.as_str()) {
            parts.headers.insert(header::HOST, v);
        }
    }
    strip_hop_by_hop(&mut parts.headers);
    if parts.version != Version::HTTP_11 {
        crate::forwarding::join_cookies(&mut parts.headers);
    }
    append_forwarded(&mut parts.headers, client, trusted);
    route.apply_request_rules(&mut parts);

    let mut deadline = Deadline::new(route.timeout, started, &parts.headers);
    let mut body = Some(match &route.mirror {
        Some(mirror) if mirror.sampled() => {
            match mirrored_body(mirror, &parts, incoming, body_rules, &mut deadline).await {
                Ok(b) => b,
                Err(resp) => return resp,
            }
        }
        _ => streamed_body(&parts, incoming, body_rules),
    });

    let mut attempt = 0u8;
    loop {
        let req_body = body.take().unwrap_or(UpstreamBody::Empty);
        // Only a request that may be retried needs its headers kept for the next attempt.
        let headers = if retryable {
            parts.headers.clone()
        } else {
            std::mem::take(&mut parts.headers)
        };
        // The first attempt starts with the request (one clock reading fewer); a retry now.
        let attempt_started = if attempt == 0 { started } else { Instant::now() };
        let outcome = attempt_once(
            target,
            &parts,
            headers,
            req_body,
            (attempt_started, deadline),
            last_endpoint,
        )
        .await;
        match outcome {
            Attempt::Done(resp) => return client_response(resp),
            Attempt::Final(resp) => return resp,
            Attempt::Retryable(resp) => {
                if retryable
                    && attempt < route.retry_attempts
                    && Instant::now() < deadline.fixed()
                    && route.retry_budget.try_withdraw()
                {
                    attempt += 1;
                    target.backend.metrics.retries.inc();
                    continue;
                }
                return resp;
            }
        }
    }
}

/// The body sent upstream when the request is not mirrored: none, or the client's as it streams.
fn streamed_body(parts: &http::request::Parts, incoming: RequestBody, body_rules: body::BodyRules) -> UpstreamBody {
    if incoming.is_end_stream() {
        return UpstreamBody::Empty;
    }
    UpstreamBody::streaming(incoming, body_rules)
        .cut_by(parts.extensions.get())
        .watched()
}

/// The body sent upstream beside a mirror's copy, which is made of the headers as the upstream
/// gets them (forwarded-for, rules). A body read whole for it is the client's time, not the
/// upstream's: the route's timeout starts after it.
async fn mirrored_body(
    mirror: &crate::mirror::CompiledMirror,
    parts: &http::request::Parts,
    incoming: RequestBody,
    body_rules: body::BodyRules,
    deadline: &mut Deadline,
) -> Result<UpstreamBody, Response<ClientBody>> {
    let b = mirrored(mirror, parts, incoming, body_rules).await?;
    deadline.from = Instant::now();
    Ok(b.cut_by(parts.extensions.get()).watched())
}

async fn attempt_once(
    target: Target<'_>,
    parts: &http::request::Parts,
    headers: HeaderMap,
    body: UpstreamBody,
    (started, deadline): (Instant, Deadline),
    last_endpoint: &mut Option<http::uri::Authority>,
) -> Attempt {
    let cluster = &target.backend.upstream;
    let endpoints = cluster.endpoints.load();
    // A retry goes to another endpoint when there is one.
    let Some(endpoint) = upstream::pick_avoiding(&endpoints, last_endpoint.as_ref()) else {
        return Attempt::Retryable(status_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "no upstream endpoints\n",
        ));
    };
    let endpoint = endpoint.clone();
    drop(endpoints);
    *last_endpoint = Some(endpoint.authority.clone());

    let pq = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let Ok(uri) = cluster.request_uri(&endpoint.authority, pq) else {
        return Attempt::Final(status_response(StatusCode::BAD_REQUEST, "bad request target\n"));
    };
    let watch = body.watch();
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    default_host(req.headers_mut(), &endpoint.authority);

    // Given back on drop: a client that cancels (an HTTP/2 reset) drops this future
    // mid-await; else the response body holds it until it ends.
    let Some(slot) = take_slot(&endpoint, deadline.fixed()).await else {
        return Attempt::Final(status_response(StatusCode::GATEWAY_TIMEOUT, "upstream timeout\n"));
    };
    let send = cluster.send(&endpoint, req);
    // Without a streamed body (the rule) one timer, as before there were bodies to watch.
    let result = match watch.as_ref().filter(|_| deadline.client.is_none()) {
        None => tokio::time::timeout_at(deadline.fixed().into(), send)
            .await
            .map_err(|_| Elapsed),
        Some(body) => deadline.after_body(send, body).await,
    };
    let blame = Blame {
        started,
        body: watch.as_ref().map_or(BodyState::Ended, |w| w.get()),
        clients_deadline: deadline.client.is_some(),
        resendable: upstream::resendable(&parts.method),
    };
    let idle = (target.route.response_idle_timeout, watch);
    let result = result.map(|sent| {
        sent.map(|(resp, reused)| {
            let resp = resp.map(|b| b.until_end(slot, idle, &cluster.metrics.response_stalls));
            (resp, reused)
        })
    });
    outcome(cluster, &endpoint, blame, result)
}

/// One of `endpoint`'s connection permits, waiting for one until `deadline`. A free permit is
/// the rule; only a full endpoint needs a timer.
async fn take_slot(endpoint: &Arc<upstream::Endpoint>, deadline: Instant) -> Option<upstream::EndpointSlot> {
    if let Some(slot) = upstream::EndpointSlot::try_take(endpoint.clone()) {
        return Some(slot);
    }
    let wait = upstream::EndpointSlot::take(endpoint.clone());
    tokio::time::timeout_at(deadline.into(), wait).await.ok().flatten()
}

/// When an attempt gives up. The route's `timeout` counts from the client body's last part
/// (its end, once sent), as Envoy's route timeout starts at the end of the downstream request:
/// an upload's own time is bounded by `limits.clientBodyTimeout` between parts, and a long
/// upload needs no long `timeout`. A gRPC client's own deadline (`grpc-timeout`), when shorter
/// than the route's, counts from the request's start and wins.
#[derive(Clone, Copy)]
struct Deadline {
    route: Duration,
    /// When the route's timeout starts at the latest: the request's start, or the end of a
    /// body read whole before the attempt. A streamed body moves it on (`after_body`).
    from: Instant,
    client: Option<Instant>,
}

impl Deadline {
    fn new(route: Duration, from: Instant, headers: &HeaderMap) -> Self {
        let client = crate::grpc::timeout(headers).filter(|t| *t < route).map(|t| from + t);
        Self { route, from, client }
    }

    /// The deadline no body moves: the client's, else the route's from `from`. A request
    /// without a streamed body (every retried one) has this one only.
    fn fixed(&self) -> Instant {
        self.client.unwrap_or(self.from + self.route)
    }

    /// `work`, or `Elapsed` once the route's timeout has passed since `body`'s last progress
    /// (with no client deadline: that one does not move).
    async fn after_body<F: std::future::Future>(&self, work: F, body: &BodyWatch) -> Result<F::Output, Elapsed> {
        let mut work = std::pin::pin!(work);
        let mut at = self.fixed();
        loop {
            if let Ok(out) = tokio::time::timeout_at(at.into(), work.as_mut()).await {
                return Ok(out);
            }
            let next = match body.get() {
                // The client's pace between parts is `clientBodyTimeout`'s to judge.
                BodyState::Sending => Instant::now() + self.route,
                _ => body.last_progress() + self.route,
            };
            if next <= at {
                return Err(Elapsed);
            }
            at = next;
        }
    }
}

/// An attempt's deadline passed.
struct Elapsed;

/// What an attempt's failure may be the client's: only the upstream's counts against it.
struct Blame {
    started: Instant,
    /// Where the client's body was when the attempt ended (`Ended` when it had none to send).
    body: BodyState,
    /// The deadline was the client's own (`grpc-timeout`), shorter than the route's.
    clients_deadline: bool,
    /// A safe method: may go again after a connection ended with no answer (it may have
    /// been carried out).
    resendable: bool,
}

/// The answer to a request whose body failed on the client's side, however the upstream
/// connection reported it (HTTP/1.1 passes the body's error on, HTTP/2 only resets the stream).
fn client_body_failure(error: &(dyn std::error::Error + 'static), state: BodyState) -> Option<Response<ClientBody>> {
    Some(
        if body::chain_contains::<body::BodyTooLarge>(error) || state == BodyState::TooLarge {
            status_response(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n")
        } else if body::chain_contains::<body::BodyTimedOut>(error) || state == BodyState::TimedOut {
            status_response(StatusCode::REQUEST_TIMEOUT, "request body timed out\n")
        } else if body::chain_contains::<body::ClientBodyError>(error) || state == BodyState::Broken {
            status_response(StatusCode::BAD_REQUEST, "malformed request body\n")
        } else {
            return None;
        },
    )
}

/// An HTTP/1.0 request may come without a Host, but it goes upstream as HTTP/1.1, which must
/// carry one (RFC 9112 §3.2; nginx answers 400 and closes the connection): the endpoint's
/// authority, as nginx's default `proxy_set_header Host $proxy_host` does.
fn default_host(headers: &mut HeaderMap, endpoint: &http::uri::Authority) {
    if !headers.contains_key(header::HOST) {
        if let Ok(v) = HeaderValue::from_str(endpoint.as_str()) {
            headers.insert(header::HOST, v);
        }
    }
}

/// What an upstream attempt's result means for the client, for retries and for the endpoint's
/// health (outlier ejection, latency).
fn outcome(
    cluster: &upstream::UpstreamCluster,
    endpoint: &upstream::Endpoint,
    blame: Blame,
    result: Result<Result<(upstream::UpstreamResponse, bool), upstream::SendError>, Elapsed>,
) -> Attempt {
    let eject = |e: &upstream::Endpoint, gateway: bool| cluster.record_failure(e, gateway);
    match result {
        // A client that stalls its body or sets a short deadline must not get endpoints ejected.
        Err(_) if !matches!(blame.body, BodyState::Ended | BodyState::Held | BodyState::Unread) => {
            Attempt::Final(status_response(
                StatusCode::REQUEST_TIMEOUT,
                "request body not received before the deadline\n",
            ))
        }
        Err(_) => {
            endpoint.observe_latency(blame.started.elapsed());
            if !blame.clients_deadline {
                eject(endpoint, true);
            }
            Attempt::Final(status_response(StatusCode::GATEWAY_TIMEOUT, "upstream timeout\n"))
        }
        Ok(Err(e)) => {
            if let Some(resp) = client_body_failure(&*e.error, blame.body) {
                return Attempt::Final(resp);
            }
            eject(endpoint, true);
            tracing::debug!(upstream = %cluster.name, endpoint = %endpoint.authority, error = %error_chain(&*e.error), "upstream request failed");
            if e.connect {
                Attempt::Retryable(status_response(StatusCode::BAD_GATEWAY, "upstream connect failed\n"))
            } else if e.unsent || (e.unanswered && blame.resendable) {
                Attempt::Retryable(status_response(StatusCode::BAD_GATEWAY, "upstream request failed\n"))
            } else {
                Attempt::Final(status_response(StatusCode::BAD_GATEWAY, "upstream request failed\n"))
            }
        }
        Ok(Ok((resp, reused))) => {
            endpoint.observe_latency(blame.started.elapsed());
            if reused {
                cluster.metrics.request_reused.inc();
            } else {
                cluster.metrics.request_new.inc();
            }
            let status = resp.status();
            if status.is_server_error() {
                eject(endpoint, matches!(status.as_u16(), 502..=504));
            } else {
                endpoint.record_success();
            }
            if matches!(status.as_u16(), 502..=504) {
                return Attempt::Retryable(client_response(resp));
            }
            Attempt::Done(resp)
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_rules_of_rfc_9112() {
        let req = |version, hosts: &[&str]| {
            let mut b = Request::builder().version(version).uri("/x");
            for h in hosts {
                b = b.header("host", *h);
            }
            b.body(()).unwrap()
        };
        assert_eq!(host_problem(&req(Version::HTTP_11, &["a"])), None);
        assert!(host_problem(&req(Version::HTTP_11, &["a", "b"])).is_some());
        assert!(host_problem(&req(Version::HTTP_11, &[])).is_some());
        assert_eq!(host_problem(&req(Version::HTTP_10, &[])), None);
        assert_eq!(host_problem(&req(Version::HTTP_2, &[])), None);
    }

    #[test]
    fn an_http2_responses_date_is_never_hpack_indexed() {
        let mut headers = HeaderMap::new();
        never_index_date(&mut headers);
        assert!(headers.is_empty(), "no Date is added");
        headers.insert(header::DATE, HeaderValue::from_static("Sat, 05 Dec 2026 08:50:00 GMT"));
        never_index_date(&mut headers);
        assert!(headers[header::DATE].is_sensitive());
    }

    #[test]
    fn request_ids_are_never_hpack_indexed_ours_or_the_clients() {
        let mut ours = HeaderMap::new();
        let id = ensure_request_id(&mut ours);
        assert!(id.is_sensitive() && ours[X_REQUEST_ID].is_sensitive());
        let mut theirs = HeaderMap::new();
        theirs.insert(X_REQUEST_ID, HeaderValue::from_static("abc"));
        let id = ensure_request_id(&mut theirs);
        assert_eq!(id, "abc", "a client's own id is kept");
        assert!(id.is_sensitive() && theirs[X_REQUEST_ID].is_sensitive());
    }
}
