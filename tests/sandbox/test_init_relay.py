"""``init.py``'s relay on its own (no sandbox needed): a TCP listener relayed to a Unix socket by one
thread, as inside every sandbox. Large bodies cross both ways at once, intact, and a half-closed
request gets its reply (that the relay adds no thread per connection is tried inside the sandbox,
against its process cap: ``test_exhaustion.py``).

``init.py`` cannot import harnessrl (nor be imported as part of it): it is loaded here as the file
the sandbox runs."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import socket
import socketserver
import threading
from pathlib import Path

import harnessrl.sandbox

INIT = Path(harnessrl.sandbox.__file__).with_name("init.py")


def load_init():
    spec = importlib.util.spec_from_file_location("sandbox_init", INIT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class EchoDigest(socketserver.ThreadingUnixStreamServer):
    """A Unix-socket server: reads until EOF, then answers with the SHA-256 of what it read, after
    sending ``extra`` bytes first (so a reply flows while the request is still arriving)."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, path: str, extra: int) -> None:
        self.extra = extra
        super().__init__(path, _AnswerDigest)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _AnswerDigest(socketserver.BaseRequestHandler):
    server: EchoDigest

    def handle(self) -> None:
        conn: socket.socket = self.request
        sender = threading.Thread(target=conn.sendall, args=(b"y" * self.server.extra,))
        sender.start()
        digest = hashlib.sha256()
        while data := conn.recv(65536):
            digest.update(data)
        sender.join()
        conn.sendall(digest.hexdigest().encode())


def relay(tmp_path: Path, extra: int) -> tuple[int, threading.Thread]:
    init = load_init()
    EchoDigest(str(tmp_path / "gw.sock"), extra)
    listener = init._listen(0)
    port = listener.getsockname()[1]
    thread = threading.Thread(target=init._Relay(listener, str(tmp_path / "gw.sock")).serve, daemon=True)
    thread.start()
    return port, thread


def test_large_bodies_cross_both_ways_at_once_intact(tmp_path):
    port, _ = relay(tmp_path, extra=8 * 1024 * 1024)
    body = os.urandom(8 * 1024 * 1024)
    client = socket.create_connection(("127.0.0.1", port), timeout=30)
    received = []

    def read_all() -> None:
        while data := client.recv(65536):
            received.append(data)

    reader = threading.Thread(target=read_all)
    reader.start()
    client.sendall(body)
    client.shutdown(socket.SHUT_WR)  # half-close: the digest comes after
    reader.join()
    reply = b"".join(received)
    assert reply[: 8 * 1024 * 1024] == b"y" * (8 * 1024 * 1024)
    assert reply[8 * 1024 * 1024 :] == hashlib.sha256(body).hexdigest().encode()
