//! SOCKS5 listeners (RFC 1928 CONNECT; no authentication, or RFC 1929 username/password): the
//! target passes the same allow-list, address checks and timeouts as HTTP CONNECT, then the
//! bytes are relayed as on a plain TCP listener. BIND and UDP ASSOCIATE are refused with
//! "command not supported".

pub mod handshake;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use subtle::ConstantTimeEq;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use proxyfleet_config::{ConnectProxy, TcpProxy, SOCKS5_PASSWORD_FILE, SOCKS5_USERNAME_FILE};

use crate::metrics::{Metrics, TcpLabels};
use crate::tunnel_target::{allowed, dial, DialError};
use handshake::{Command, Credentials, Invalid, Parsed, Reply};

/// The one user allowed in, read from the credentials directory.
struct User {
    username: Vec<u8>,
    password: Vec<u8>,
}

/// Reading the credentials directory failed.
#[derive(Debug, thiserror::Error)]
#[error("reading SOCKS5 credentials {path}: {source}")]
pub struct CredentialsError {
    path: String,
    source: std::io::Error,
}

fn read_secret_file(dir: &str, name: &str) -> Result<Vec<u8>, CredentialsError> {
    let path = Path::new(dir).join(name);
    let mut bytes = std::fs::read(&path).map_err(|source| CredentialsError {
        path: path.display().to_string(),
        source,
    })?;
    // A file written by `echo` ends in a newline that is not part of the secret.
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    Ok(bytes)
}

/// Why a connection ended before relaying; the `result` label of its counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    BadHandshake,
    AuthFailed,
    CommandNotSupported,
    NotAllowed,
    TargetFailed,
}

const REFUSALS: [Refusal; 5] = [
    Refusal::BadHandshake,
    Refusal::AuthFailed,
    Refusal::CommandNotSupported,
    Refusal::NotAllowed,
    Refusal::TargetFailed,
];

impl Refusal {
    fn label(self) -> &'static str {
        match self {
            Refusal::BadHandshake => "bad_handshake",
            Refusal::AuthFailed => "auth_failed",
            Refusal::CommandNotSupported => "command_not_supported",
            Refusal::NotAllowed => "not_allowed",
            Refusal::TargetFailed => "target_failed",
        }
    }
}

/// A SOCKS5 listener's compiled settings (rebuilt on reload).
pub struct Socks5Listener {
    connect: ConnectProxy,
    user: Option<User>,
    handshake_timeout: Duration,
    relayed: Counter,
    refused: [Counter; REFUSALS.len()],
    to_upstream: Counter,
    to_client: Counter,
    duration: Histogram,
}

const ROUTE: &str = "socks5";

impl Socks5Listener {
    /// `connect` is the fleet's CONNECT settings (validation makes it present in socks5 mode).
    pub fn new(
        listener: &str,
        t: &TcpProxy,
        connect: ConnectProxy,
        metrics: &Metrics,
    ) -> Result<Self, CredentialsError> {
        let user = match t.socks5.as_ref().and_then(|a| a.credentials_dir.as_deref()) {
            Some(dir) => Some(User {
                username: read_secret_file(dir, SOCKS5_USERNAME_FILE)?,
                password: read_secret_file(dir, SOCKS5_PASSWORD_FILE)?,
            }),
            None => None,
        };
        let labels = TcpLabels {
            listener: listener.to_string(),
            route: ROUTE.to_string(),
        };
        let result = |result| metrics.tcp.connections(&labels, result);
        Ok(Self {
            connect,
            user,
            handshake_timeout: t.client_hello_timeout.get(),
            relayed: result("relayed"),
            refused: REFUSALS.map(|r| result(r.label())),
            to_upstream: metrics.tcp.bytes(&labels, "to_upstream"),
            to_client: metrics.tcp.bytes(&labels, "to_client"),
            duration: metrics.tcp.duration.get_or_create(&labels).clone(),
        })
    }

    fn count(&self, refusal: Refusal) {
        if let Some(i) = REFUSALS.iter().position(|r| *r == refusal) {
            self.refused[i].inc();
        }
    }

    fn password_ok(&self, c: &Credentials) -> bool {
        self.user.as_ref().is_some_and(|u| {
            let name: bool = u.username.ct_eq(&c.username).into();
            let password: bool = u.password.ct_eq(&c.password).into();
            name & password
        })
    }
}

/// The bytes received so far, of which the parsed messages are removed.
struct Inbox {
    buf: Vec<u8>,
}

impl Inbox {
    /// Reads until `parse` has a message; removes its bytes. Err(None): the client went away.
    async fn next<T>(&mut self, client: &mut TcpStream, parse: fn(&[u8]) -> Parsed<T>) -> Result<T, Option<Invalid>> {
        loop {
            match parse(&self.buf) {
                Parsed::Done(message, used) => {
                    self.buf.drain(..used);
                    return Ok(message);
                }
                Parsed::Invalid(why) => return Err(Some(why)),
                Parsed::NeedMore => {}
            }
            let mut chunk = [0u8; 512];
            match client.read(&mut chunk).await {
                Ok(n) if n > 0 => self.buf.extend_from_slice(&chunk[..n]),
                _ => return Err(None),
            }
        }
    }
}

/// Method selection and, when required, the password sub-negotiation.
async fn authenticate(l: &Socks5Listener, client: &mut TcpStream, inbox: &mut Inbox) -> Result<(), Refusal> {
    let offered = inbox
        .next(client, handshake::greeting)
        .await
        .map_err(|_| Refusal::BadHandshake)?;
    let method = handshake::choose_method(offered, l.user.is_some());
    let _ = client.write_all(&[5, method]).await;
    match method {
        handshake::METHOD_NONE => Ok(()),
        handshake::METHOD_PASSWORD => {
            let c = inbox
                .next(client, handshake::credentials)
                .await
                .map_err(|_| Refusal::BadHandshake)?;
            let ok = l.password_ok(&c);
            let _ = client.write_all(&[1, if ok { 0 } else { 1 }]).await;
            ok.then_some(()).ok_or(Refusal::AuthFailed)
        }
        _ => Err(Refusal::AuthFailed),
    }
}

/// Refuses with a reply code.
async fn refuse(client: &mut TcpStream, code: Reply, refusal: Refusal) -> Refusal {
    let _ = client.write_all(&handshake::reply(code, None)).await;
    refusal
}

fn dial_reply(e: DialError) -> (Reply, Refusal) {
    match e {
        DialError::AddressNotAllowed => (Reply::NotAllowed, Refusal::NotAllowed),
        DialError::Refused => (Reply::ConnectionRefused, Refusal::TargetFailed),
        DialError::DoesNotResolve | DialError::TimedOut | DialError::Unreachable => {
            (Reply::HostUnreachable, Refusal::TargetFailed)
        }
    }
}

/// The whole handshake: the connected target, and any bytes the client sent after its
/// request (to forward first).
async fn handshake(l: &Socks5Listener, client: &mut TcpStream) -> Result<(TcpStream, Vec<u8>), Refusal> {
    let mut inbox = Inbox {
        buf: Vec::with_capacity(512),
    };
    authenticate(l, client, &mut inbox).await?;
    let request = match inbox.next(client, handshake::request).await {
        Ok(r) => r,
        Err(Some(why)) => return Err(refuse(client, why.reply(), Refusal::BadHandshake).await),
        Err(None) => return Err(Refusal::BadHandshake),
    };
    if request.command != Command::Connect {
        return Err(refuse(client, Reply::CommandNotSupported, Refusal::CommandNotSupported).await);
    }
    let target = request.target.authority();
    if !allowed(&l.connect.allow, &target) {
        tracing::debug!(%target, "socks5: refused by the connect allow-list");
        return Err(refuse(client, Reply::NotAllowed, Refusal::NotAllowed).await);
    }
    let upstream = match dial(&l.connect, &target).await {
        Ok(s) => s,
        Err(e) => {
            let (code, refusal) = dial_reply(e);
            return Err(refuse(client, code, refusal).await);
        }
    };
    let _ = upstream.set_nodelay(true);
    let reply = handshake::reply(Reply::Succeeded, upstream.local_addr().ok());
    client.write_all(&reply).await.map_err(|_| Refusal::BadHandshake)?;
    Ok((upstream, inbox.buf))
}

/// One client connection on a SOCKS5 listener.
pub async fn serve(l: &Socks5Listener, mut client: TcpStream, remote: SocketAddr) {
    let started = Instant::now();
    let (mut upstream, early) = match tokio::time::timeout(l.handshake_timeout, handshake(l, &mut client)).await {
        Ok(Ok(connected)) => connected,
        Ok(Err(refusal)) => {
            tracing::debug!(client = %remote, result = refusal.label(), "socks5: refused");
            return l.count(refusal);
        }
        Err(_) => return l.count(Refusal::BadHandshake),
    };
    if !early.is_empty() && upstream.write_all(&early).await.is_err() {
        return l.count(Refusal::TargetFailed);
    }
    l.relayed.inc();
    let moved = crate::relay::relay(client, upstream, l.connect.idle_timeout.get()).await;
    l.to_upstream.inc_by(moved.to_upstream + early.len() as u64);
    l.to_client.inc_by(moved.to_client);
    l.duration.observe(started.elapsed().as_secs_f64());
}
