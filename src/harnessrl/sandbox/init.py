"""The first process inside a sandbox (runs as the unprivileged sandbox user, standard library only).

``python -I -S /run/harnessrl/init.py PORT SOCKET STATUS_FD -- ARGV...``: when ``PORT`` is not ``0``
it listens on ``127.0.0.1:PORT`` in the sandbox's own network namespace and relays every connection
to the gateway through ``SOCKET``, the one Unix socket bound into the sandbox; then it starts
``ARGV`` (the harness, or an evaluator command) and exits with its status, ``128 + N`` if a signal
``N`` killed it. So the harness reaches the gateway at the usual ``http://127.0.0.1:PORT`` and
nothing else. This file is bound read-only into the sandbox by itself: it cannot import harnessrl
(the project is not visible inside).

``STATUS_FD`` (inherited from the launcher, ``-1`` for none) gets ``ok`` right before the exec of
``ARGV`` and is closed by it, or ``error: ...`` if ``ARGV`` cannot start: the launcher's only sign
that the command never ran. Nothing the command does can write there, so no exit status it chooses
can pass for "the sandbox failed".

When ``ARGV`` exits, every other process of the sandbox is killed at once (``kill(-1, SIGKILL)``),
before this process reports: nothing the command left behind outlives it to write into a file (a
scorer's stdout, say) that someone reads next.
"""

import contextlib
import os
import signal
import sys

CANNOT_START = 127


class _Flow:
    """One direction of a relayed connection: bytes read from ``src`` wait in ``pending`` for ``dst``."""

    def __init__(self, src, dst) -> None:
        self.src, self.dst = src, dst
        self.pending = b""
        self.eof = False  # ``src`` said it sends no more
        self.passed_on = False  # ``dst``'s writing side was shut down after the last byte

    @property
    def done(self) -> bool:
        return self.eof and not self.pending


class _Relay:
    """Every relayed connection, served by one thread with one ``selectors`` loop.

    No thread per connection: threads count against the sandbox's process limit (the ``pids``
    cgroup), so a harness holding a few dozen connections would make starting one fail, and a relay
    that died of it would leave every later request hanging until the harness's deadline. A
    connection whose Unix side cannot be opened is closed and the loop keeps accepting.

    A half-close passes through: when one side ends its writing (``shutdown(SHUT_WR)``, EOF), only
    the writing side of the other is shut down, so the reply still comes back; both sockets are
    closed once both directions are done, or at once if either fails.
    """

    def __init__(self, listener, unix_path: str) -> None:
        import selectors

        self.unix_path = unix_path
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.flows: dict = {}  # socket -> (the flow it reads for, the flow it writes for)
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ)

    def serve(self) -> None:
        while True:
            for key, events in self.selector.select():
                if key.fileobj is self.listener:
                    if not self._accept():
                        return
                elif key.fileobj in self.flows:
                    self._step(key.fileobj, events)

    def _accept(self) -> bool:
        import socket

        try:
            client, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:
            import errno

            # Out of descriptors (or another passing error): refuse this one, keep serving.
            return exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED)
        upstream = None
        try:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.unix_path)
        except OSError:
            for s in (client, upstream):
                if s is not None:
                    s.close()
            return True
        client.setblocking(False)
        upstream.setblocking(False)
        outbound, inbound = _Flow(client, upstream), _Flow(upstream, client)
        self.flows[client] = (outbound, inbound)
        self.flows[upstream] = (inbound, outbound)
        for s in (client, upstream):
            self._watch(s)
        return True

    def _interest(self, sock) -> int:
        import selectors

        reads, writes = self.flows[sock]
        # Read only what can be passed on: nothing new while the other side has not taken the last.
        events = selectors.EVENT_READ if not reads.eof and not reads.pending else 0
        return events | (selectors.EVENT_WRITE if writes.pending else 0)

    def _step(self, sock, events: int) -> None:
        import selectors
        import socket

        reads, writes = self.flows[sock]
        try:
            if events & selectors.EVENT_READ:
                data = sock.recv(65536)
                if data:
                    reads.pending = data
                    self._send(reads)
                else:
                    reads.eof = True
            if events & selectors.EVENT_WRITE:
                self._send(writes)
            for flow in (reads, writes):
                if flow.done and not flow.passed_on:
                    flow.passed_on = True
                    flow.dst.shutdown(socket.SHUT_WR)  # pass the end of this direction on, no more
        except OSError:
            self._close(sock)
            return
        if reads.done and writes.done:
            self._close(sock)
            return
        for s in (reads.src, reads.dst):
            self._watch(s)

    def _watch(self, sock) -> None:
        """Wait on ``sock`` for what its flows need now (nothing: not watched until that changes)."""
        events = self._interest(sock)
        try:
            self.selector.get_key(sock)
        except KeyError:
            if events:
                self.selector.register(sock, events)
            return
        if events:
            self.selector.modify(sock, events)
        else:
            self.selector.unregister(sock)

    def _send(self, flow: _Flow) -> None:
        try:
            sent = flow.dst.send(flow.pending)
        except BlockingIOError:
            return
        flow.pending = flow.pending[sent:]

    def _close(self, sock) -> None:
        reads, _ = self.flows[sock]
        for s in (reads.src, reads.dst):
            self.flows.pop(s, None)
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(s)
            s.close()


def _listen(port: int):
    # Imported only when relaying: a bare start (an evaluator) stays at the interpreter's own start-up.
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    return listener


def _executable(name: str):
    """The path ``execvp`` would run for ``name``, or None (what a shell's ``command -v`` tells)."""
    if "/" in name:
        return name if os.access(name, os.X_OK) and not os.path.isdir(name) else None
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def _say(fd: int, message: bytes) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.write(fd, message)


def main(argv: list[str]) -> int:
    port, unix_path, status_fd, sep, command = int(argv[1]), argv[2], int(argv[3]), argv[4], argv[5:]
    if sep != "--" or not command:
        print("usage: init.py PORT SOCKET STATUS_FD -- ARGV...", file=sys.stderr)
        return CANNOT_START
    if status_fd >= 0:
        try:
            os.set_inheritable(status_fd, False)  # the command must never hold it
        except OSError:
            status_fd = -1  # not passed (started by hand): nobody listens
    # Listen before the command starts (its first connection queues until accepted), but fork before
    # any relay thread exists; the child gets /dev/null as stdin and execs the command.
    listener = _listen(port) if port else None
    pid = os.fork()
    if pid == 0:
        try:
            if listener is not None:
                listener.close()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            # Python ignores these and an ignored signal stays ignored across exec: give the command
            # the defaults any program expects (what ``subprocess``'s ``restore_signals`` does), so a
            # shell pipeline ends on SIGPIPE and a write past ``limits.file_mb`` kills as SIGXFSZ.
            for ignored in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):
                if hasattr(signal, ignored):
                    signal.signal(getattr(signal, ignored), signal.SIG_DFL)
            if _executable(command[0]) is None:
                raise FileNotFoundError(f"not found or not executable (PATH={os.environ.get('PATH', '')})")
            _say(status_fd, b"ok\n")  # an exec failing after this (ENOEXEC...) exits 127, as a program would
            os.execvp(command[0], command)
        except OSError as exc:
            # After "ok" the launcher may have closed the status pipe (an exec failing late: a script
            # whose interpreter is missing): SIGPIPE, restored above, killed this process as 141
            # before it said why. The message goes to stderr first, the pipe's write may just fail.
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
            print(f"harnessrl sandbox: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
            _say(status_fd, f"error: cannot start {command[0]!r}: {exc}\n".encode())
        os._exit(CANNOT_START)
    if status_fd >= 0:
        os.close(status_fd)
    if listener is not None:
        import threading

        # One thread for every relayed connection (no thread each: see ``_Relay``).
        threading.Thread(target=_Relay(listener, unix_path).serve, daemon=True).start()
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    # Whatever the command left running dies now, before anyone reads what the command wrote. This
    # process is the only one spared: the sandbox's own PID namespace holds nothing of the host's.
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
