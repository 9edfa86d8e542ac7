"""Real peers for the HTTP/3 e2e (aioquic from PyPI, not our code):

  serve IP PORT                        an HTTP/1.1 upstream answering every request with its
                                       method, path, body length and headers as JSON
  get NAME IP PORT CA PATH...          one HTTP/3 connection to IP:PORT (SNI and :authority
                                       NAME), a GET per PATH and a POST; one JSON line each
  zero-rtt NAME IP PORT CA             a connection that gets a session ticket, then a resumed
                                       one sending a GET and a POST as 0-RTT early data, its
                                       Finished held back 0.5 s (`SlowFinish`); one JSON line
                                       each, with whether the server took early data
"""
import asyncio
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self):
        length = int(self.headers.get("content-length") or 0)
        got = self.rfile.read(length) if length else b""
        body = json.dumps({
            "method": self.command,
            "path": self.path,
            "body": len(got),
            "headers": {k.lower(): v for k, v in self.headers.items()},
        }).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


class H3Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.waiting = {}

    def quic_event_received(self, event):
        for ev in self.h3.handle_event(event):
            if not isinstance(ev, (HeadersReceived, DataReceived)) or ev.stream_id not in self.waiting:
                continue
            fut, acc = self.waiting[ev.stream_id]
            if isinstance(ev, HeadersReceived) and "status" not in acc:
                headers = {k.decode(): v.decode() for k, v in ev.headers}
                acc["status"] = int(headers.pop(":status"))
                acc["headers"] = headers
            elif isinstance(ev, DataReceived):
                acc["body"] += ev.data
            if ev.stream_ended and not fut.done():
                fut.set_result(acc)

    def send(self, name, method, path, body=b""):
        sid = self._quic.get_next_available_stream_id()
        headers = [(b":method", method.encode()), (b":scheme", b"https"),
                   (b":authority", name.encode()), (b":path", path.encode())]
        if body:
            headers.append((b"content-length", str(len(body)).encode()))
        self.h3.send_headers(sid, headers, end_stream=not body)
        if body:
            self.h3.send_data(sid, body, end_stream=True)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[sid] = (fut, {"body": b""})
        self.transmit()
        return fut


class SlowFinish(H3Client):
    """A client whose handshake ends late: once its handshake is complete it sends nothing
    (its Finished, its acknowledgements) for HOLD seconds. Requests sent as 0-RTT data are then
    certainly read by the server before the handshake is done, whatever the network's speed:
    without the hold, on a fast network the server could see the Finished before it read a
    request, serve it as an ordinary one, and a test expecting a held-back request would pass
    or fail by luck (session 28: 43-http3 once counted no held-back POST)."""

    HOLD = 0.5

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._hold_until = None
        self._resume = None

    def transmit(self):
        if self._quic._handshake_complete:
            now = self._loop.time()
            if self._hold_until is None:
                self._hold_until = now + self.HOLD
            if now < self._hold_until:
                if self._resume is None:
                    self._resume = self._loop.call_at(self._hold_until, self.transmit)
                return
        super().transmit()


def result(acc, **extra):
    body = acc["body"].decode(errors="replace")
    try:
        body = json.loads(body)
    except ValueError:
        pass
    print(json.dumps({"status": acc["status"], "headers": acc["headers"], "body": body, **extra}), flush=True)


def configuration(name, ca):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=name)
    cfg.load_verify_locations(ca)
    return cfg


async def get(name, ip, port, ca, paths):
    async with connect(ip, port, configuration=configuration(name, ca), create_protocol=H3Client) as c:
        for p in paths:
            result(await asyncio.wait_for(c.send(name, "GET", p), 10))
        result(await asyncio.wait_for(c.send(name, "POST", "/post", b"x" * 1000), 10))


async def zero_rtt(name, ip, port, ca):
    tickets = []
    cfg = configuration(name, ca)
    async with connect(ip, port, configuration=cfg, create_protocol=H3Client,
                       session_ticket_handler=tickets.append) as c:
        result(await asyncio.wait_for(c.send(name, "GET", "/first"), 10))
        await asyncio.sleep(0.2)
    if not tickets:
        sys.exit("no session ticket from the server")
    cfg = configuration(name, ca)
    cfg.session_ticket = tickets[-1]
    async with connect(ip, port, configuration=cfg, create_protocol=SlowFinish, wait_connected=False) as c:
        g = c.send(name, "GET", "/early")
        p = c.send(name, "POST", "/early-post", b"y" * 10)
        g, p = await asyncio.wait_for(asyncio.gather(g, p), 10)
        accepted = bool(c._quic.tls.early_data_accepted)
        result(g, early_data_accepted=accepted)
        result(p, early_data_accepted=accepted)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "serve":
        server = ThreadingHTTPServer((args[0], int(args[1])), Echo)
        print("echo listening", flush=True)
        server.serve_forever()
    elif cmd == "get":
        asyncio.run(get(args[0], args[1], int(args[2]), args[3], args[4:]))
    elif cmd == "zero-rtt":
        asyncio.run(zero_rtt(args[0], args[1], int(args[2]), args[3]))


if __name__ == "__main__":
    main()
