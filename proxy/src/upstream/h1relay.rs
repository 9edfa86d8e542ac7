//! Our own HTTP/1.1 exchange on an upstream connection, for requests whose body is known whole
//! (none, or buffered): the request's future writes the request and reads the response head
//! itself, and the response body reads straight from the connection, which goes back to the
//! endpoint's idle list the moment the body's last byte is read. No connection task, no
//! channels: hyper's client hands each request to a task per connection and every response
//! and body part back over channels, three task wake-ups per request on the keep-alive path
//! (docs/performance.md, docs/decisions.md). Requests that stream a body still go through
//! hyper's client (`h1pool`), which writes and reads at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::Method;
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncWriteExt;
use tokio_util::io::poll_read_buf;

use super::h1wire::{self, Chunk, ChunkedState, Framing, Head, Parsed, WireError};
use super::pool::UpstreamConnection;

/// The largest response head we read (hyper's client allows ~400 KiB; nginx 4–8 KiB).
const MAX_HEAD: usize = 64 * 1024;
/// What one read asks the kernel for.
const READ_SIZE: usize = 8 * 1024;
/// A body up to this size is written in the same write as the head.
const COALESCE: usize = 16 * 1024;

/// An upstream connection that speaks our HTTP/1.1 exchange.
pub struct RelayConn {
    io: UpstreamConnection,
    /// Bytes read and not yet consumed. Empty between exchanges.
    buf: BytesMut,
    /// The request head being written (its allocation kept between requests).
    out: Vec<u8>,
    /// When it went idle.
    since: Instant,
}

/// An endpoint's idle connections, one list per worker (`crate::workers`), most recently used
/// last: a connection is registered with the I/O driver of the worker that opened it, so it
/// stays with that worker's requests and a checkout crosses no thread.
#[derive(Default)]
pub struct IdleRelays(crate::workers::PerWorker<Mutex<Vec<RelayConn>>>);

impl IdleRelays {
    /// The calling worker's list.
    fn mine(&self) -> &Mutex<Vec<RelayConn>> {
        self.0.mine()
    }

    /// How many the calling worker keeps.
    pub fn len(&self) -> usize {
        self.mine().lock().map(|l| l.len()).unwrap_or(0)
    }

    /// Keeps a new connection, or one whose exchange ended cleanly, unless the calling worker
    /// keeps `max` already.
    pub fn keep(&self, mut conn: RelayConn, max: usize) {
        conn.since = Instant::now();
        if let Ok(mut list) = self.mine().lock() {
            if list.len() < max {
                list.push(conn);
            }
        }
    }

    /// The calling worker's most recently kept connection that is still fresh and open,
    /// dropping the others.
    pub fn take(&self, idle_timeout: Duration) -> Option<RelayConn> {
        let mut list = self.mine().lock().ok()?;
        let now = Instant::now();
        while let Some(mut c) = list.pop() {
            if now.duration_since(c.since) < idle_timeout && c.looks_open() {
                return Some(c);
            }
        }
        None
    }

    /// Closes the connections idle for `idle_timeout` or closed by the upstream meanwhile.
    pub fn reap(&self, now: Instant, idle_timeout: Duration) {
        for list in self.0.all() {
            if let Ok(mut list) = list.lock() {
                list.retain_mut(|c| now.duration_since(c.since) < idle_timeout && c.looks_open());
            }
        }
    }
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("writing the request to {endpoint}: {source}")]
    Write {
        endpoint: http::uri::Authority,
        source: std::io::Error,
    },
    #[error("{endpoint} closed the connection before answering")]
    Unanswered { endpoint: http::uri::Authority },
    #[error("reading the response from {endpoint}: {source}")]
    Read {
        endpoint: http::uri::Authority,
        source: std::io::Error,
    },
    #[error("{endpoint} closed the connection inside a response")]
    Cut { endpoint: http::uri::Authority },
    #[error("{endpoint} sent a response head over {MAX_HEAD} bytes")]
    HeadTooLarge { endpoint: http::uri::Authority },
    #[error("{endpoint}: {source}")]
    Wire {
        endpoint: http::uri::Authority,
        source: WireError,
    },
}

impl RelayError {
    /// The upstream read nothing of the request for sure, or answered nothing: a request on a
    /// reused connection the upstream had closed meanwhile. Idempotent ones may go again.
    pub fn unanswered(&self) -> bool {
        matches!(self, Self::Write { .. } | Self::Unanswered { .. })
    }
}

impl RelayConn {
    pub fn new(io: UpstreamConnection) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
            out: Vec::new(),
            since: Instant::now(),
        }
    }

    /// Whether an idle connection still looks open: nothing arrived on it (an idle upstream
    /// connection has nothing to say but its end). A non-blocking read, which makes no system
    /// call while the socket has not turned readable; outside tokio's cooperative budget, which
    /// would otherwise say "pending" for a connection that has ended.
    pub fn looks_open(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        self.buf.reserve(64);
        let (io, buf) = (&mut self.io, &mut self.buf);
        let probe =
            std::future::poll_fn(|cx| Poll::Ready(poll_read_buf(Pin::new(&mut *io), cx, &mut *buf).is_pending()));
        let mut probe = std::pin::pin!(tokio::task::unconstrained(probe));
        match probe.as_mut().poll(&mut cx) {
            Poll::Ready(open) => open,
            Poll::Pending => true,
        }
    }

    /// Writes the request and reads the final response's head.
    pub async fn exchange(
        &mut self,
        parts: &http::request::Parts,
        body: Option<&Bytes>,
        endpoint: &http::uri::Authority,
    ) -> Result<Head, RelayError> {
        self.write_request(parts, body)
            .await
            .map_err(|source| RelayError::Write {
                endpoint: endpoint.clone(),
                source,
            })?;
        self.read_head(&parts.method, endpoint).await
    }

    async fn write_request(&mut self, parts: &http::request::Parts, body: Option<&Bytes>) -> std::io::Result<()> {
        let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let body_len = body.map_or(0, |b| b.len());
        self.out.clear();
        h1wire::encode_request(&parts.method, target, &parts.headers, body_len as u64, &mut self.out);
        match body {
            Some(b) if b.len() <= COALESCE => {
                self.out.extend_from_slice(b);
                self.io.write_all(&self.out).await?;
            }
            Some(b) => {
                self.io.write_all(&self.out).await?;
                self.io.write_all(b).await?;
            }
            None => self.io.write_all(&self.out).await?,
        }
        self.io.flush().await
    }

    async fn read_head(&mut self, method: &Method, endpoint: &http::uri::Authority) -> Result<Head, RelayError> {
        let mut received = false;
        loop {
            if !self.buf.is_empty() {
                let parsed = h1wire::parse_response(&mut self.buf, method).map_err(|source| RelayError::Wire {
                    endpoint: endpoint.clone(),
                    source,
                })?;
                match parsed {
                    Parsed::Final(head) => return Ok(head),
                    Parsed::Interim => continue,
                    Parsed::Partial if self.buf.len() >= MAX_HEAD => {
                        return Err(RelayError::HeadTooLarge {
                            endpoint: endpoint.clone(),
                        })
                    }
                    Parsed::Partial => {}
                }
            }
            match std::future::poll_fn(|cx| self.poll_fill(cx)).await {
                Ok(0) if !received => {
                    return Err(RelayError::Unanswered {
                        endpoint: endpoint.clone(),
                    })
                }
                Ok(0) => {
                    return Err(RelayError::Cut {
                        endpoint: endpoint.clone(),
                    })
                }
                Ok(_) => received = true,
                Err(e) if !received && is_reset(&e) => {
                    return Err(RelayError::Unanswered {
                        endpoint: endpoint.clone(),
                    })
                }
                Err(source) => {
                    return Err(RelayError::Read {
                        endpoint: endpoint.clone(),
                        source,
                    })
                }
            }
        }
    }

    /// Reads more into the buffer; Ok(0) at the connection's end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(READ_SIZE);
        }
        poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }
}

/// The connection ended under us: reset, or (TLS) closed without a close_notify, which rustls
/// reports as an unexpected EOF.
fn is_reset(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
    )
}

/// Where a connection goes when its response is read: its endpoint's idle list.
pub struct Home {
    pub idle: Arc<IdleRelays>,
    pub max_idle: usize,
    /// The endpoint, for errors.
    pub endpoint: http::uri::Authority,
}

impl Home {
    /// Keeps `conn` for the next request when the exchange left it clean.
    fn keep(self, conn: RelayConn) {
        if conn.buf.is_empty() {
            self.idle.keep(conn, self.max_idle);
        }
    }
}

/// Where a response body is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Length(u64),
    Chunked(ChunkedState),
    UntilClose,
    Done,
}

/// A response body read from its connection as the client's side asks for it.
pub struct RelayBody {
    state: State,
    conn: Option<RelayConn>,
    /// None: the connection closes after this response.
    home: Option<Home>,
    endpoint: http::uri::Authority,
}

/// What the buffered bytes gave.
enum Step {
    Frame(Frame<Bytes>),
    End,
    More,
}

impl RelayBody {
    /// The body of `head` on `conn`; an empty one hands the connection home at once.
    pub fn new(head_framing: Framing, keep_alive: bool, conn: RelayConn, home: Home) -> Self {
        let state = match head_framing {
            Framing::Empty => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Chunked(ChunkedState::Size),
            Framing::UntilClose => State::UntilClose,
        };
        let endpoint = home.endpoint.clone();
        let mut body = Self {
            state,
            conn: Some(conn),
            home: keep_alive.then_some(home),
            endpoint,
        };
        if state == State::Done {
            body.finish();
        }
        body
    }

    /// The body is read whole: its connection goes home (or closes).
    fn finish(&mut self) {
        self.state = State::Done;
        if let (Some(conn), Some(home)) = (self.conn.take(), self.home.take()) {
            home.keep(conn);
        }
    }

    /// Decodes from the bytes already read.
    fn step(state: &mut State, buf: &mut BytesMut) -> Result<Step, WireError> {
        Ok(match state {
            State::Done => Step::End,
            State::Length(_) | State::UntilClose if buf.is_empty() => Step::More,
            State::Length(left) => {
                let n = (buf.len() as u64).min(*left);
                *left -= n;
                if *left == 0 {
                    *state = State::Done;
                }
                Step::Frame(Frame::data(buf.split_to(n as usize).freeze()))
            }
            State::UntilClose => Step::Frame(Frame::data(buf.split().freeze())),
            State::Chunked(dec) => match dec.decode(buf)? {
                Some(Chunk::Data(d)) => Step::Frame(Frame::data(d)),
                Some(Chunk::End(trailers)) => {
                    *state = State::Done;
                    match trailers {
                        Some(t) => Step::Frame(Frame::trailers(t)),
                        None => Step::End,
                    }
                }
                None => Step::More,
            },
        })
    }

    fn fail(&mut self, error: RelayError) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        self.state = State::Done;
        self.conn = None;
        Poll::Ready(Some(Err(error)))
    }
}

/// A body dropped before its end (a retried 5xx, a client gone) still brings its connection
/// home when the rest of it has already been read, as hyper's client did; otherwise the
/// connection closes.
impl Drop for RelayBody {
    fn drop(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        loop {
            match Self::step(&mut self.state, &mut conn.buf) {
                Ok(Step::Frame(_)) if self.state != State::Done => {}
                Ok(Step::Frame(_) | Step::End) => return self.finish(),
                Ok(Step::More) | Err(_) => return,
            }
        }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match Self::step(&mut this.state, &mut conn.buf) {
                Ok(Step::Frame(f)) => {
                    if this.state == State::Done {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(f)));
                }
                Ok(Step::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Step::More) => {}
                Err(source) => {
                    let endpoint = this.endpoint.clone();
                    return this.fail(RelayError::Wire { endpoint, source });
                }
            }
            match ready!(conn.poll_fill(cx)) {
                Ok(0) if this.state == State::UntilClose => {
                    this.state = State::Done;
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    let endpoint = this.endpoint.clone();
                    return this.fail(RelayError::Cut { endpoint });
                }
                Ok(_) => {}
                Err(source) => {
                    let endpoint = this.endpoint.clone();
                    return this.fail(RelayError::Read { endpoint, source });
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Done => SizeHint::with_exact(0),
            State::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

/// Builds the response for `head`, its body reading from `conn`.
pub fn response(head: Head, conn: RelayConn, home: Home) -> http::Response<RelayBody> {
    let body = RelayBody::new(head.framing, head.keep_alive, conn, home);
    let mut resp = http::Response::new(body);
    *resp.status_mut() = head.status;
    // The client gets the response in its own protocol, not in the upstream's version.
    *resp.version_mut() = http::Version::HTTP_11;
    *resp.headers_mut() = head.headers;
    if let Some(reason) = head.reason {
        resp.extensions_mut().insert(reason);
    }
    resp
}

/// Whether a request may be sent again after its connection ended unanswered: only safe
/// methods (RFC 9110 §9.2.1). An unanswered PUT or DELETE may have been carried out before the
/// upstream went away, and hyper's client never sent a written request twice either.
pub fn resendable(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE)
}
