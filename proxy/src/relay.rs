//! Relaying bytes both ways between a client and an upstream, counting them: TLS passthrough,
//! plain TCP and SOCKS5 listeners, CONNECT tunnels and upgraded (WebSocket) connections. Each
//! direction ends on its own: EOF from one side is passed on as a half-close (shutdown of the
//! write side, END_STREAM on an HTTP/2 tunnel) after everything read before it, so protocols
//! that half-close keep working and a side's last bytes are never cut off by the other side
//! closing. Both end when neither moved a byte for `idle`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Bytes moved each way.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Relayed {
    pub to_upstream: u64,
    pub to_client: u64,
}

/// When a byte last moved, in ms since the relay started.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn idle_for(&self) -> Duration {
        self.start
            .elapsed()
            .saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

async fn one_way<R, W>(mut from: R, mut to: W, moved: &AtomicU64, activity: &Activity)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Flushed at once: a TLS stream may hold written bytes until flushed, and the peer
        // may wait for them before it sends anything more.
        if to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
            break;
        }
        moved.fetch_add(n as u64, Ordering::Relaxed);
        activity.touch();
    }
    let _ = to.shutdown().await;
}

/// Copies `client` ⇄ `upstream` until both directions end or the connection idles out. The
/// sockets are split into owned halves: no lock between the two directions.
pub async fn relay(client: TcpStream, upstream: TcpStream, idle: Duration) -> Relayed {
    relay_halves(client.into_split(), upstream.into_split(), idle).await
}

/// [`relay`] for any two streams (an upgraded HTTP/1.1 or HTTP/2 connection, a TLS stream):
/// each is split with `tokio::io::split`, a lock held only while one half is polled.
pub async fn relay_streams<A, B>(client: A, upstream: B, idle: Duration) -> Relayed
where
    A: AsyncRead + AsyncWrite,
    B: AsyncRead + AsyncWrite,
{
    relay_halves(tokio::io::split(client), tokio::io::split(upstream), idle).await
}

async fn relay_halves<CR, CW, UR, UW>(
    (client_r, client_w): (CR, CW),
    (upstream_r, upstream_w): (UR, UW),
    idle: Duration,
) -> Relayed
where
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + Unpin,
    UR: AsyncRead + Unpin,
    UW: AsyncWrite + Unpin,
{
    let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
    let activity = Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    };
    let both = async {
        tokio::join!(
            one_way(client_r, upstream_w, &up, &activity),
            one_way(upstream_r, client_w, &down, &activity)
        )
    };
    let idled_out = async {
        loop {
            let idle_for = activity.idle_for();
            if idle_for >= idle {
                break;
            }
            tokio::time::sleep(idle - idle_for).await;
        }
    };
    tokio::select! {
        _ = both => {}
        _ = idled_out => {}
    }
    Relayed {
        to_upstream: up.into_inner(),
        to_client: down.into_inner(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair of loopback sockets: (ours, the peer's).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (l.accept().await.unwrap().0, c)
    }

    #[tokio::test]
    async fn half_close_passes_and_bytes_are_counted() {
        let (client, mut client_peer) = pair().await;
        let (upstream, mut upstream_peer) = pair().await;
        let relay = tokio::spawn(relay(client, upstream, Duration::from_secs(60)));
        client_peer.write_all(b"request").await.unwrap();
        client_peer.shutdown().await.unwrap();
        let mut got = Vec::new();
        upstream_peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"request", "the client's EOF reached the upstream");
        upstream_peer.write_all(b"answer after half-close").await.unwrap();
        drop(upstream_peer);
        let mut back = Vec::new();
        client_peer.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"answer after half-close");
        let r = relay.await.unwrap();
        assert_eq!(
            r,
            Relayed {
                to_upstream: 7,
                to_client: 23
            }
        );
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed() {
        let (client, mut client_peer) = pair().await;
        let (upstream, _upstream_peer) = pair().await;
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            relay(client, upstream, Duration::from_millis(200)),
        )
        .await;
        assert_eq!(r.unwrap(), Relayed::default());
        let mut rest = Vec::new();
        client_peer.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the client sees the close");
    }

    #[tokio::test]
    async fn any_stream_keeps_its_last_bytes_and_its_other_direction_after_a_close() {
        let (client, mut client_peer) = tokio::io::duplex(64);
        let (upstream, mut upstream_peer) = tokio::io::duplex(64);
        let relay = tokio::spawn(relay_streams(client, upstream, Duration::from_secs(60)));
        // The upstream's last frame, then its close: both reach the client, in order.
        upstream_peer.write_all(&[0x88, 0x00]).await.unwrap();
        upstream_peer.shutdown().await.unwrap();
        let mut last = [0u8; 2];
        client_peer.read_exact(&mut last).await.unwrap();
        assert_eq!(last, [0x88, 0x00]);
        assert_eq!(client_peer.read(&mut last).await.unwrap(), 0, "then the half-close");
        // The client's direction still flows until it ends too.
        client_peer.write_all(b"bye").await.unwrap();
        client_peer.shutdown().await.unwrap();
        let mut got = Vec::new();
        upstream_peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"bye");
        assert_eq!(
            relay.await.unwrap(),
            Relayed {
                to_upstream: 3,
                to_client: 2
            }
        );
    }
}
