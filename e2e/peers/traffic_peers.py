"""Real protocol peers for the real-traffic e2e test (e2e/tests/38-real-traffic.sh).

  serve HOST WS_PORT GRPC_PORT SSE_PORT   a WebSocket echo server (websockets), a gRPC server
                                          (grpcio: health Check/Watch), and a server-sent-events
                                          server (5 events, 0.4 s apart, chunked)
  check IP CA_FILE HOSTNAME               clients through the fleet's Service: WebSocket echoes,
                                          gRPC unary + server streaming, SSE delivered as sent

Prints one line per check; exits non-zero on the first failure.
"""

import http.server
import socket
import ssl
import sys
import threading
import time


def serve(host, ws_port, grpc_port, sse_port):
    import logging
    from concurrent import futures

    # The WebSocket server's handshakes, timed, for a failing check to be read against.
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s", level=logging.INFO)

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from websockets.sync.server import serve as ws_serve

    def echo(conn):
        for message in conn:
            conn.send(message)

    ws = ws_serve(echo, host, ws_port, max_size=4 * 1024 * 1024)
    threading.Thread(target=ws.serve_forever, daemon=True).start()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    server.add_insecure_port(f"{host}:{grpc_port}")
    server.start()

    def flap():  # so a Watch stream has updates to carry
        serving = True
        while True:
            time.sleep(0.3)
            serving = not serving
            status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
            servicer.set("e2e", status)

    threading.Thread(target=flap, daemon=True).start()

    class Events(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(5):
                data = f"id: {i}\ndata: event {i} sent {time.time():.3f}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                time.sleep(0.4)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def log_message(self, *args):
            pass

    sse = http.server.ThreadingHTTPServer((host, sse_port), Events)
    threading.Thread(target=sse.serve_forever, daemon=True).start()
    print(f"peers listening on {host}: ws {ws_port} grpc {grpc_port} sse {sse_port}", flush=True)
    while True:
        time.sleep(3600)


def tls_context(ca_file, alpn):
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.set_alpn_protocols(alpn)
    return ctx


def check_websocket(ip, ca_file, hostname):
    """websockets' asyncio client: one thread drives the TLS connection. Its threaded sync
    client reads in a background thread while the caller writes, two threads on one
    ssl.SSLSocket, which CPython does not make safe: when a TLS 1.3 session ticket arrives
    while the request is written, the write can wait for the socket to become readable and the
    handshake request is never sent (1 in ~30 connections to a freshly started proxy here; see
    docs/decisions.md)."""
    import asyncio

    from websockets.asyncio.client import connect

    async def run():
        sock = socket.create_connection((ip, 443), timeout=10)
        ctx = tls_context(ca_file, ["http/1.1"])
        async with connect(f"wss://{hostname}/ws", sock=sock, ssl=ctx, max_size=4 * 1024 * 1024, open_timeout=10) as ws:
            for i in range(50):
                await ws.send(f"hello {i}")
                got = await asyncio.wait_for(ws.recv(), 10)
                if got != f"hello {i}":
                    raise SystemExit(f"websocket: sent 'hello {i}', got {got!r}")
            blob = bytes(range(256)) * 4096  # 1 MiB
            await ws.send(blob)
            if await asyncio.wait_for(ws.recv(), 20) != blob:
                raise SystemExit("websocket: the 1 MiB binary message came back changed")
            # The closing handshake: the server's Close reply (sent just before it closes its
            # connection) must come back through the fleet.
            await asyncio.wait_for(ws.close(code=1000, reason="done"), 10)
            reply = ws.protocol.close_rcvd
            if reply is None or reply.code != 1000:
                raise SystemExit(f"websocket: no Close reply from the server, got {reply!r}")

    asyncio.run(run())
    print("websocket: 50 text echoes, a 1 MiB binary echo and the closing handshake through the fleet", flush=True)


def check_grpc(ip, ca_file, hostname):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with open(ca_file, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    options = [("grpc.ssl_target_name_override", hostname), ("grpc.default_authority", hostname)]
    with grpc.secure_channel(f"{ip}:443", creds, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(20):
            r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            if r.status != health_pb2.HealthCheckResponse.SERVING:
                raise SystemExit(f"grpc: Check answered {r.status}")
        try:
            stub.Check(health_pb2.HealthCheckRequest(service="unknown"), timeout=10)
            raise SystemExit("grpc: an unknown service was not NOT_FOUND")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise SystemExit(f"grpc: unknown service answered {e.code()}, not NOT_FOUND")
        statuses = []
        stream = stub.Watch(health_pb2.HealthCheckRequest(service="e2e"), timeout=20)
        for r in stream:
            statuses.append(r.status)
            if len(statuses) == 4:
                stream.cancel()
                break
        if len(statuses) < 4 or len(set(statuses)) < 2:
            raise SystemExit(f"grpc: Watch carried {statuses}, expected 4 updates of both kinds")
        # The proxy's own failure, as a gRPC status: a path no route takes.
        try:
            channel.unary_unary("/nothing.Here/Method")(b"", timeout=10)
            raise SystemExit("grpc: a call with no route succeeded")
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE):
                raise SystemExit(f"grpc: no route answered {e.code()}: {e.details()}")
            no_route = f"{e.code().name} ({e.details()})"
    print(f"grpc: 20 unary Checks SERVING, NOT_FOUND from the server, a Watch stream of {len(statuses)} updates, no route -> {no_route}", flush=True)


def check_sse(ip, ca_file, hostname):
    ctx = tls_context(ca_file, ["http/1.1"])
    raw = socket.create_connection((ip, 443), timeout=10)
    s = ctx.wrap_socket(raw, server_hostname=hostname)
    s.sendall(f"GET /events HTTP/1.1\r\nHost: {hostname}\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n".encode())
    start = time.time()
    arrivals = []
    buf = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        while b"data: event " in buf:
            _, _, buf = buf.partition(b"data: event ")
            arrivals.append(time.time() - start)
    s.close()
    if len(arrivals) != 5:
        raise SystemExit(f"sse: {len(arrivals)} events arrived, expected 5")
    # Sent 0.4 s apart: unbuffered, the first arrives long before the last.
    spread = arrivals[-1] - arrivals[0]
    if spread < 1.2:
        raise SystemExit(f"sse: events arrived together ({arrivals}): the proxy buffered the stream")
    print("sse: 5 events arrived as sent, at " + ", ".join(f"{a:.2f}" for a in arrivals) + " s", flush=True)


def main():
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1] == "check":
        ip, ca_file, hostname = sys.argv[2:5]
        check_websocket(ip, ca_file, hostname)
        check_grpc(ip, ca_file, hostname)
        check_sse(ip, ca_file, hostname)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
