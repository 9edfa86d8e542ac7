"""Slow and hostile clients against one proxy (issue 18's "done means"), printed as a table.

  python3 bench/hostile_clients.py HOST PORT CA_FILE SNI PROXY_PID [N]

Opens N TLS connections that send 5 bytes of the HTTP/2 preface and stop, and N that send the
whole preface and SETTINGS and then idle (never answering PINGs); then times a normal request
on a fresh connection, prints the proxy's RSS, and waits to see how long each kind stays open.
Run by bench/hostile-clients.sh, which starts a release proxy with a 10 s header timeout.
"""

import os
import select
import socket
import ssl
import sys
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def connect(host, port, ctx, sni, alpn):
    ctx.set_alpn_protocols([alpn])
    s = ctx.wrap_socket(socket.create_connection((host, port), timeout=10), server_hostname=sni)
    s.setblocking(False)
    return s


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def still_open(socks):
    n = 0
    for s in socks:
        try:
            r, _, _ = select.select([s], [], [], 0)
            if r:
                data = s.recv(65536)
                if data == b"":
                    continue  # closed by the proxy
                # PINGs or SETTINGS arrive on the idle h2 ones: still open.
            n += 1
        except (ssl.SSLWantReadError, BlockingIOError):
            n += 1
        except (ConnectionError, ssl.SSLError, OSError):
            continue
    return n


def normal_request_ms(host, port, ca, sni):
    ctx = ssl.create_default_context(cafile=ca)
    t = time.perf_counter()
    s = ctx.wrap_socket(socket.create_connection((host, port), timeout=10), server_hostname=sni)
    s.sendall(f"GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n".encode())
    data = s.recv(65536)
    ms = (time.perf_counter() - t) * 1000
    s.close()
    return ms, data.split(b"\r\n", 1)[0].decode()


def main():
    host, port, ca, sni, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    n = int(sys.argv[6]) if len(sys.argv) > 6 else 500
    ctx = ssl.create_default_context(cafile=ca)
    print(f"proxy RSS before: {rss_mib(pid):.1f} MiB")
    half, idle = [], []
    for _ in range(n):
        s = connect(host, port, ssl.create_default_context(cafile=ca), sni, "h2")
        s.setblocking(True)
        s.sendall(PREFACE[:5])
        s.setblocking(False)
        half.append(s)
    for _ in range(n):
        s = connect(host, port, ssl.create_default_context(cafile=ca), sni, "h2")
        s.setblocking(True)
        s.sendall(PREFACE + SETTINGS)
        s.setblocking(False)
        idle.append(s)
    opened = time.time()
    ms, status = normal_request_ms(host, port, ca, sni)
    print(f"{n} half-preface + {n} idle h2 connections open: a normal request took {ms:.1f} ms ({status})")
    print(f"proxy RSS with them open: {rss_mib(pid):.1f} MiB")
    gone_half = gone_idle = None
    while time.time() - opened < 90 and (gone_half is None or gone_idle is None):
        time.sleep(1)
        if gone_half is None and still_open(half) == 0:
            gone_half = time.time() - opened
        if gone_idle is None and still_open(idle) == 0:
            gone_idle = time.time() - opened
    fmt = lambda t: f"{t:.0f} s" if t is not None else "still open after 90 s"
    print(f"half-preface connections all closed after: {fmt(gone_half)}")
    print(f"idle h2 connections (PINGs unanswered) all closed after: {fmt(gone_idle)}")
    print(f"proxy RSS after: {rss_mib(pid):.1f} MiB")
    ms, status = normal_request_ms(host, port, ca, sni)
    print(f"a normal request afterwards: {ms:.1f} ms ({status})")
    del ctx


if __name__ == "__main__":
    main()
