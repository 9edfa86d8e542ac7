"""HTTP/2 streams that are never given a flow-control window, against one proxy.

  python3 bench/stalled_streams.py HOST PORT CA_FILE SNI PATH N HOLD_SECONDS

Opens one TLS connection (ALPN h2) whose SETTINGS give every stream a window of 0, asks for
PATH on N streams, then reads everything the proxy sends and answers its SETTINGS and PINGs, so
that no write of the proxy's ever blocks: the streams stall on flow control alone. Holds them
for HOLD_SECONDS and prints what came back. Used by e2e/tests/13-standalone-conformance.sh to
show that such a client cannot freeze the proxy's shared HTTP/2 upstream connection.
"""

import select
import signal
import socket
import ssl
import struct
import sys
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
ACK, END_STREAM, END_HEADERS = 0x1, 0x1, 0x4


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name, value):
    """An HPACK literal header field without indexing, new name, no Huffman coding."""

    def string(b):
        assert len(b) < 127
        return bytes([len(b)]) + b

    return b"\x00" + string(name) + string(value)


def request_block(sni, path):
    return (
        literal(b":method", b"GET")
        + literal(b":scheme", b"https")
        + literal(b":path", path.encode())
        + literal(b":authority", sni.encode())
    )


class Seen:
    def __init__(self):
        self.heads, self.resets = set(), set()
        self.data = 0
        self.goaway = False
        self.closed = False
        self.stopped = False


def handle(sock, seen, kind, flags, stream, payload):
    if kind == HEADERS:
        seen.heads.add(stream)
    elif kind == DATA:
        seen.data += len(payload)
    elif kind == RST_STREAM:
        seen.resets.add(stream)
    elif kind == SETTINGS and not flags & ACK:
        send(sock, frame(SETTINGS, ACK, 0))
    elif kind == PING and not flags & ACK:
        send(sock, frame(PING, ACK, 0, payload))
    elif kind == GOAWAY:
        seen.goaway = True


def send(sock, data):
    while data:
        try:
            n = sock.send(data)
            data = data[n:]
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            select.select([], [sock], [], 1)


def read_for(sock, seconds, seen):
    buf = b""
    deadline = time.time() + seconds
    while time.time() < deadline and not seen.stopped:
        ready, _, _ = select.select([sock], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = sock.recv(65536)
        except (ssl.SSLWantReadError, BlockingIOError):
            continue
        if not chunk:
            seen.closed = True
            return
        buf += chunk
        while len(buf) >= 9:
            length = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + length:
                break
            kind, flags = buf[3], buf[4]
            stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            handle(sock, seen, kind, flags, stream, buf[9 : 9 + length])
            buf = buf[9 + length :]


def main():
    host, port, ca, sni, path, n, hold = sys.argv[1:8]
    n, hold = int(n), float(hold)
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["h2"])
    sock = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=sni)
    assert sock.selected_alpn_protocol() == "h2", "the proxy did not agree on h2"
    sock.setblocking(False)
    # Every stream's window 0: no DATA may come; no server push.
    out = PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 0x4, 0) + struct.pack(">HI", 0x2, 0))
    block = request_block(sni, path)
    for i in range(n):
        out += frame(HEADERS, END_STREAM | END_HEADERS, 1 + 2 * i, block)
    send(sock, out)
    seen = Seen()
    # SIGTERM ends the hold early, with the report.
    signal.signal(signal.SIGTERM, lambda *_: setattr(seen, "stopped", True))
    started = time.time()
    read_for(sock, hold, seen)
    print(
        f"stalled streams: {n}, response heads: {len(seen.heads)}, data bytes: {seen.data}, "
        f"resets: {len(seen.resets)}, goaway: {seen.goaway}, "
        f"connection {'closed by the proxy' if seen.closed else 'open'} after {time.time() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
