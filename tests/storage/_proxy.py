"""A small HTTP proxy that injects faults between the S3 client and a local S3 server.

Each request is forwarded to the upstream server and answered on a fresh connection
(``Connection: close``; with ``keep_alive``, on the client's connection, kept open as a
store such as S3 keeps it: moto's server closes each one), unless the fault chosen for it
says otherwise: added latency, a dropped connection (closed with no response), a 503
``SlowDown``, a truncated body (the full ``Content-Length`` announced, half the bytes sent)
or a corrupted body (one byte flipped, length kept). Faults apply to GETs of shard files
only when ``match`` says so.
"""

from __future__ import annotations

import http.client
import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Callable

FAULTS = ("drop", "503", "truncate", "corrupt")


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream`` (``host:port``), injecting faults.

    Attributes:
        latency_s: Added before each answer.
        plan: Faults handed out in turn to the requests that ``match`` accepts
            (``None`` in the list: no fault for that request); empty: none.
        gets: How many GETs each path received (faulty ones included).
        damage_once: Damage a body (``"truncate"``, ``"corrupt"``) at most once per path;
            a later damage the plan hands that path is sent clean.
        hold: When set to an event, the requests that ``match`` accepts wait for it before
            they are answered; ``held`` counts those waiting now.
        keep_alive: Answer without closing the client's connection (faults still close it).
        connections: How many TCP connections clients opened to the proxy.
    """

    def __init__(self, upstream: str, match: Callable[[str, str], bool] | None = None) -> None:
        self.upstream = upstream
        self.match = match or (lambda method, path: method == "GET" and ".h5" in path)
        self.latency_s = 0.0
        self.plan: list[str | None] = []
        self.repeat = False  # cycle through the plan instead of using it once
        self.damage_once = False
        self._damaged: set[str] = set()
        self.gets: Counter[str] = Counter()
        self.log: list[tuple[str, str]] = []  # (method, path) of every request, in order
        self.faults_sent: Counter[str] = Counter()
        self.hold: threading.Event | None = None
        self.held = 0
        self.keep_alive = False
        self.connections = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                with proxy._lock:
                    proxy.connections += 1
                proxy._handle(self.rfile, self.connection)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next_fault(self, method: str, path: str) -> str | None:
        with self._lock:
            self.log.append((method, path.split("?", maxsplit=1)[0]))
            if method == "GET":
                self.gets[path.split("?", maxsplit=1)[0]] += 1
            if not self.plan or not self.match(method, path):
                return None
            fault = self.plan.pop(0)
            if self.repeat:
                self.plan.append(fault)
            if self.damage_once and fault in ("truncate", "corrupt"):
                key = path.split("?", maxsplit=1)[0]
                fault = None if key in self._damaged else fault
                self._damaged.add(key)
            if fault:
                self.faults_sent[fault] += 1
            return fault

    def _wait_for_hold(self, method: str, path: str) -> None:
        hold = self.hold
        if hold is None or not self.match(method, path):
            return
        with self._lock:
            self.held += 1
        try:
            hold.wait(120)  # a guard against a hang: the test sets it
        finally:
            with self._lock:
                self.held -= 1

    def _handle(self, rfile, connection: socket.socket) -> None:  # type: ignore[no-untyped-def]
        while True:
            line = rfile.readline()
            if not line:
                return
            method, target, _ = line.decode("latin-1").split(" ", 2)
            headers: list[tuple[str, str]] = []
            while (header := rfile.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = header.decode("latin-1").partition(":")
                headers.append((name.strip(), value.strip()))
            lowered = {k.lower(): v for k, v in headers}
            if lowered.get("expect", "").lower() == "100-continue":
                connection.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                headers = [(k, v) for k, v in headers if k.lower() != "expect"]
            length = int(lowered.get("content-length", 0))
            body = rfile.read(length) if length else b""
            fault = self._next_fault(method, target)
            self._wait_for_hold(method, target)
            if self.latency_s:
                time.sleep(self.latency_s)
            if fault == "drop":
                connection.close()
                return
            if fault == "503":
                error = b"<Error><Code>SlowDown</Code><Message>slow down</Message></Error>"
                connection.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                    + f"Content-Length: {len(error)}\r\nConnection: close\r\n\r\n".encode()
                    + error
                )
                connection.close()
                return
            upstream = http.client.HTTPConnection(self.upstream, timeout=30)
            try:
                skip = {"connection", "keep-alive", "proxy-connection"}
                upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    if name.lower() not in skip:
                        upstream.putheader(name, value)
                upstream.endheaders(body or None)
                response = upstream.getresponse()
                payload = response.read()
                status, reason, reply = response.status, response.reason, response.getheaders()
            finally:
                upstream.close()
            if fault == "corrupt" and payload:
                payload = payload[:-1] + bytes([payload[-1] ^ 0xFF])
            sent = payload[: len(payload) // 2] if fault == "truncate" else payload
            head = f"HTTP/1.1 {status} {reason}\r\n"
            for name, value in reply:
                if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                    head += f"{name}: {value}\r\n"
            length_header = response.getheader("Content-Length", "0")
            announced = length_header if method == "HEAD" else str(len(payload))
            keep_open = self.keep_alive and fault is None
            head += f"Content-Length: {announced}\r\n"
            head += "Connection: keep-alive\r\n\r\n" if keep_open else "Connection: close\r\n\r\n"
            connection.sendall(head.encode("latin-1") + sent)
            if not keep_open:
                connection.close()
                return
