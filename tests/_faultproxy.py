"""A small fault-injecting HTTP proxy for the S3 tests: it sits on 127.0.0.1 in front of the moto
server and forwards raw HTTP/1.1, one request per client connection (it answers with
``Connection: close``), so the S3 client sees real sockets fail.

Faults, injected on every ``every``-th request in a fixed cycle (so each kind surely happens):

* ``500`` / ``503``: an S3 error reply (``InternalError`` / ``SlowDown``), request not forwarded;
* ``stall``: no reply until the client gives up (its read timeout), request not forwarded;
* ``reset``: the connection is reset (RST) without a reply, request not forwarded;
* ``drop``: a PUT is forwarded and applied, then the reply is dropped (connection closed);
* ``drop_ref``: the same, on a PUT of a ref (``/refs/``): the lost reply of a conditional write;
* ``late_ref``: a ref PUT is forwarded and applied, and the reply never comes (client timeout).

``strip=True`` removes ``If-Match``/``If-None-Match`` (a storage that ignores conditional writes);
``strip_only=(("PUT", "if-match"), ...)`` removes just those headers from just those methods (a
storage that honours some conditions and not others);
``deny=True`` answers everything with 403 AccessDenied.
"""

from __future__ import annotations

import itertools
import select
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from typing import Any

KINDS = ("500", "503", "stall", "reset", "drop", "drop_ref", "late_ref")
PUT_ONLY = {"drop", "drop_ref", "late_ref"}
REF_ONLY = {"drop_ref", "late_ref"}

_ERRORS = {
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error."),
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "403": (403, "Forbidden", "AccessDenied", "Access Denied"),
}


def _read_head(f: Any) -> bytes:
    lines = []
    while True:
        line = f.readline(65537)
        if not line:
            raise ConnectionError("client closed")
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _read_chunked(f: Any) -> bytes:
    out = bytearray()
    while True:
        size_line = f.readline(65537)
        out += size_line
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailers, then an empty line
                line = f.readline(65537)
                out += line
                if line in (b"\r\n", b"\n", b""):
                    return bytes(out)
        out += f.read(size + 2)


class FaultProxy:
    def __init__(self, upstream: str, *, every: int = 0, kinds: tuple[str, ...] = KINDS,
                 stall: float = 3.0, strip: bool = False, deny: bool = False,
                 strip_only: tuple[tuple[str, str], ...] = ()) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.every = every
        self._cycle = itertools.cycle(kinds)
        self.stall = stall
        self.strip = strip
        self.strip_only = strip_only
        self.deny = deny
        self.lock = threading.Lock()
        self.requests = 0
        self.faults: Counter[str] = Counter()
        self._pending: str | None = None
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    proxy._handle(self.request)
                except (OSError, ValueError):
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128

        self.server = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def arm(self, kind: str) -> None:
        """Inject ``kind`` on the next request it applies to."""
        with self.lock:
            self._pending = kind

    def _decide(self, method: str, target: str) -> str | None:
        with self.lock:
            self.requests += 1
            if self._pending is None and self.every and self.requests % self.every == 0:
                self._pending = next(self._cycle)
            kind = self._pending
            if kind is None:
                return None
            if kind in PUT_ONLY and method != "PUT":
                return None
            if kind in REF_ONLY and "/refs/" not in target:
                return None
            self._pending = None
            self.faults[kind] += 1
            return kind

    def _handle(self, sock: socket.socket) -> None:
        sock.settimeout(60)
        f = sock.makefile("rb")
        head = _read_head(f)
        lines = head.split(b"\r\n")
        method, target, _version = lines[0].decode("latin-1").split(" ", 2)
        headers = [(k.strip(), v.strip()) for k, _, v in
                   (h.decode("latin-1").partition(":") for h in lines[1:] if h)]
        lower = {k.lower(): v for k, v in headers}
        if lower.get("expect", "").lower() == "100-continue":
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "content-length" in lower:
            body = f.read(int(lower["content-length"]))
        elif lower.get("transfer-encoding", "").lower() == "chunked":
            body = _read_chunked(f)
        else:
            body = b""
        if self.deny:
            with self.lock:
                self.requests += 1
            self._error(sock, "403")
            return
        kind = self._decide(method, target)
        if kind in ("500", "503"):
            self._error(sock, kind)
            return
        if kind == "stall":
            self._hold(sock)
            return
        if kind == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            return
        drop = {"expect", "connection", "keep-alive", "proxy-connection"}
        if self.strip:
            drop |= {"if-match", "if-none-match"}
        drop |= {h for m, h in self.strip_only if m == method}
        out = [f"{method} {target} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers
                                                  if k.lower() not in drop]
        out.append("Connection: close")
        request = ("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + body
        with socket.create_connection(self.upstream, timeout=60) as up:
            up.sendall(request)
            chunks = []
            while True:
                data = up.recv(65536)
                if not data:
                    break
                chunks.append(data)
        response = b"".join(chunks)
        if kind in ("drop", "drop_ref"):  # applied upstream; the reply is lost
            sock.close()
            return
        if kind == "late_ref":
            self._hold(sock)
            return
        rhead, sep, rbody = response.partition(b"\r\n\r\n")
        rlines = [h for h in rhead.split(b"\r\n")
                  if not h.lower().startswith((b"connection:", b"keep-alive:"))]
        sock.sendall(b"\r\n".join(rlines + [b"Connection: close"]) + b"\r\n\r\n" + rbody)
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def _hold(self, sock: socket.socket) -> None:
        """Say nothing until the client gives up (or ``stall`` seconds pass)."""
        end = time.monotonic() + self.stall
        while time.monotonic() < end:
            ready, _, _ = select.select([sock], [], [], 0.1)
            if ready and not sock.recv(1024):
                break
        sock.close()

    @staticmethod
    def _error(sock: socket.socket, kind: str) -> None:
        status, reason, code, message = _ERRORS[kind]
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{message}</Message><RequestId>fault</RequestId></Error>").encode()
        sock.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                     + body)
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
