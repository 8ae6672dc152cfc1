"""A long-lived scorer process driven from the event loop: ``ScorerProcess``.

The controller never runs an untrusted answer through a scorer itself. It starts a scorer process
(``python -I -B -m MODULE ARGS``: isolated mode, so no ``PYTHONPATH``, user site or current folder;
a scrubbed environment without the admin key or anything else of the controller's; a private
temporary folder as its working folder; a session of its own) on first use, keeps it, and talks to
it over its stdin/stdout in JSON lines, one request and one reply per score, matched by id. The
pipes are non-blocking and watched by the event loop (``add_reader``/``add_writer``): a slow or
stuck scorer never blocks it.

The process must answer its start with ``{"ready": true, ...}`` (``ready_info``). A process that
exits is restarted on the next request; a request whose process died is sent once more to a new one,
and fails with ``ScorerUnavailable`` if that dies too, as does a process that cannot start or does not
reply within the request's time limit (it is then killed). ``ScorerUnavailable`` is an infrastructure
failure: nothing an answer does in a well-made scorer process can cause it.

The process is not an asyncio transport: it outlives the event loop that started it (a later loop
takes its pipes over; requests in flight on the old one are lost; one loop at a time). It ends when
its input closes (``aclose``, or this process exiting) or, when the ``ScorerProcess`` is collected
without ``aclose``, is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

# Passed through from the controller's environment; nothing else is.
_INHERITED_ENV = ("LANG", "LC_ALL", "TZ")
# One thread per numeric library: the scorer process forks, and a thread pool does not survive a fork.
_SINGLE_THREADED = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}
_LINE_LIMIT = 1 << 22  # bytes of one reply line
_STDERR_LINES = 40  # kept for error messages


class ScorerUnavailable(RuntimeError):
    """The scorer process could not start, died twice on one request, or stopped answering."""


class _Gone(Exception):
    """The process a request was sent to is dead."""


class _Process:
    """One started scorer process and its pipes, watched by ``loop``. The pipes stay open until
    ``close`` (or until this object is collected, which a loop watching them prevents)."""

    def __init__(self, popen: subprocess.Popen[bytes], folder: str, max_in_flight: int):
        self.popen, self.folder = popen, folder
        self.fd_in, self.fd_out, self.fd_err = (
            pipe.fileno()  # type: ignore[union-attr]
            for pipe in (popen.stdin, popen.stdout, popen.stderr)
        )
        for fd in (self.fd_in, self.fd_out, self.fd_err):
            os.set_blocking(fd, False)
        self.max_in_flight = max_in_flight
        self.pidfd: int | None = _pidfd(popen.pid)  # signals reach this process, never a later one
        self.loop: asyncio.AbstractEventLoop | None = None
        self.readers: set[int] = set()  # what ``loop`` watches for us
        self.writing = False
        self.slots = asyncio.Semaphore(max_in_flight)
        self.ready: asyncio.Future[dict[str, Any]] | None = None
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.stdout, self.stderr_buffer, self.unsent = bytearray(), bytearray(), bytearray()
        self.stderr: deque[str] = deque(maxlen=_STDERR_LINES)
        self.gone = False

    # -- the event loop's side ----------------------------------------------------------------------

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the pipes from ``loop`` (taking them over from an earlier loop, now gone)."""
        if self.loop is loop:
            return
        self.detach()
        self.loop = loop
        self.slots = asyncio.Semaphore(self.max_in_flight)
        loop.add_reader(self.fd_out, self._on_stdout)
        loop.add_reader(self.fd_err, self._on_stderr)
        self.readers = {self.fd_out, self.fd_err}
        if self.unsent:
            loop.add_writer(self.fd_in, self._on_writable)
            self.writing = True

    def detach(self) -> None:
        self._unwatch()
        self.loop = None
        self.pending.clear()  # futures of that loop: nobody awaits them on another one
        self.ready = None

    def _unwatch(self) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            for fd in self.readers:
                loop.remove_reader(fd)
            if self.writing:
                loop.remove_writer(self.fd_in)
        self.readers, self.writing = set(), False

    def send(self, line: bytes) -> None:
        if self.gone or self.loop is None:
            raise _Gone
        if not self.unsent:
            try:
                line = line[os.write(self.fd_in, line) :]
            except BlockingIOError:
                pass
            except OSError:
                self.lost("its input is closed")
                raise _Gone from None
            if not line:
                return
            self.loop.add_writer(self.fd_in, self._on_writable)
            self.writing = True
        self.unsent += line

    def _on_writable(self) -> None:
        try:
            del self.unsent[: os.write(self.fd_in, self.unsent)]
        except BlockingIOError:
            return
        except OSError:
            self.lost("its input is closed")
            return
        if not self.unsent and self.loop is not None and self.writing:
            self.loop.remove_writer(self.fd_in)
            self.writing = False

    def _on_stdout(self) -> None:
        data = _read(self.fd_out)
        if data is None:
            return
        if not data:
            self.lost("it exited")
            return
        self.stdout += data
        while (end := self.stdout.find(b"\n")) >= 0:
            line = bytes(self.stdout[:end])
            del self.stdout[: end + 1]
            self._line(line)
        if len(self.stdout) > _LINE_LIMIT:
            self.lost("a reply over the line limit")

    def _line(self, line: bytes) -> None:
        # This runs in an event-loop callback: anything it raised would abandon the lines after this
        # one in the buffer (a reply among them then times out, an infrastructure failure), so an
        # unreadable line of any kind is only noted.
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            self.stderr.append(f"unreadable reply: {line[:200]!r}")
            return
        if self.ready is not None and not self.ready.done():
            self.ready.set_result(message if isinstance(message, dict) else {})
            return
        request_id = message.get("id") if isinstance(message, dict) else None
        # Only an int can be a request's id (a list would make the lookup raise TypeError).
        future = self.pending.get(request_id) if type(request_id) is int else None
        if future is not None and not future.done():
            future.set_result(message)

    def _on_stderr(self) -> None:
        data = _read(self.fd_err)
        if data is None:
            return
        if not data:
            if self.loop is not None and self.fd_err in self.readers:
                self.loop.remove_reader(self.fd_err)
                self.readers.discard(self.fd_err)
            return
        self.stderr_buffer += data
        *lines, rest = self.stderr_buffer.split(b"\n")
        self.stderr.extend(line.decode(errors="replace").rstrip()[:500] for line in lines)
        self.stderr_buffer = bytearray(rest[-4096:])

    def lost(self, why: str) -> None:
        """The process is (or must be treated as) dead: kill it, fail every request in flight."""
        if self.gone:
            return
        self.gone = True
        self.stderr.append(f"[harnessrl] scorer process lost: {why}")
        self.kill()
        self._unwatch()
        for future in [*self.pending.values(), *([self.ready] if self.ready is not None else [])]:
            if not future.done():
                future.set_exception(_Gone())

    def kill(self) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        else:
            with contextlib.suppress(OSError):
                self.popen.kill()  # checks it was not reaped yet

    def stderr_tail(self) -> str:
        return "\n".join(self.stderr)[-2000:]

    def close(self, grace_s: float) -> None:
        """Blocking: end of input, wait up to ``grace_s``, kill, reap, free. Run it in a thread."""
        with contextlib.suppress(OSError):
            self.popen.stdin.close()  # type: ignore[union-attr]
        try:
            self.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            self.popen.wait()
        for pipe in (self.popen.stdout, self.popen.stderr):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None
        shutil.rmtree(self.folder, ignore_errors=True)


class ScorerProcess:
    """``python -I -B -m module *args``, started on first use; ``request`` sends one JSON request."""

    def __init__(
        self,
        module: str,
        args: Sequence[str] = (),
        *,
        max_in_flight: int = 16,
        start_timeout_s: float = 120.0,
    ):
        self.module, self.args = module, tuple(args)
        self.max_in_flight = max_in_flight
        self.start_timeout_s = start_timeout_s
        self.starts = 0  # processes started so far
        self._process: _Process | None = None
        self._ready_info: dict[str, Any] = {}
        self._starting: asyncio.Future[_Process] | None = None
        self._ids = itertools.count(1)
        weakref.finalize(self, _forget, self.__dict__)

    @property
    def pid(self) -> int | None:
        process = self._process
        return None if process is None or process.gone else process.popen.pid

    @property
    def ready_info(self) -> dict[str, Any]:
        """The running process's ready line (empty before it started)."""
        return dict(self._ready_info)

    async def request(self, payload: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        """Send ``payload`` (an ``id`` is added) and return the reply with that id."""
        process = await self._running()
        try:
            return await self._call(process, payload, timeout_s)
        except _Gone:
            pass  # e.g. killed by the kernel's OOM killer: once more, on a new process
        process = await self._running()
        try:
            return await self._call(process, payload, timeout_s)
        except _Gone:
            raise ScorerUnavailable(
                f"the scorer process died twice while scoring this request; stderr: {process.stderr_tail()}"
            ) from None

    async def aclose(self) -> None:
        """End the process: close its input (it exits on end of input), then kill what is left."""
        process, self._process = self._process, None
        if process is not None:
            process.detach()
            await asyncio.to_thread(process.close, 5.0)

    async def _running(self) -> _Process:
        loop = asyncio.get_running_loop()
        process = self._process
        if process is not None and not process.gone:
            process.attach(loop)
            return process
        starting = self._starting
        if starting is None or starting.get_loop() is not loop or starting.done():
            starting = self._starting = loop.create_future()
            loop.create_task(self._start(starting))
        return await asyncio.shield(starting)

    async def _start(self, starting: asyncio.Future[_Process]) -> None:
        try:
            old, self._process = self._process, None
            if old is not None:
                old.detach()
                await asyncio.to_thread(old.close, 0.0)
            process = await self._spawn()
            self._process = process
            starting.set_result(process)
        except BaseException as exc:
            if not starting.done():
                starting.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    async def _spawn(self) -> _Process:
        folder = tempfile.mkdtemp(prefix="harnessrl-scorer-")  # 0700
        env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
        env.update(_SINGLE_THREADED, HOME=folder, TMPDIR=folder, PATH=os.defpath)
        argv = [sys.executable, "-I", "-B", "-m", self.module, *self.args]
        self.starts += 1
        try:
            popen = await asyncio.to_thread(
                subprocess.Popen,
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=folder,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise ScorerUnavailable(f"cannot start the scorer process: {exc}") from exc
        process = _Process(popen, folder, self.max_in_flight)
        loop = asyncio.get_running_loop()
        process.attach(loop)
        process.ready = loop.create_future()  # the first line (no callback runs before we await it)
        try:
            ready = await asyncio.wait_for(process.ready, self.start_timeout_s)
        except (TimeoutError, _Gone):
            ready = {"error": "no ready line"}
        if ready.get("ready") is not True:
            process.lost("it did not start")
            process.detach()
            await asyncio.to_thread(process.close, 0.0)
            raise ScorerUnavailable(
                f"the scorer process did not start: {ready.get('error')}; stderr: {process.stderr_tail()}"
            )
        self._ready_info = ready
        return process

    async def _call(self, process: _Process, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        async with process.slots:
            request_id = next(self._ids)
            reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            process.pending[request_id] = reply
            try:
                process.send(json.dumps({**payload, "id": request_id}).encode() + b"\n")
                try:
                    return await asyncio.wait_for(reply, timeout_s)
                except TimeoutError:
                    process.lost(f"no reply within {timeout_s:g}s")  # stuck: later requests get a new one
                    raise ScorerUnavailable(
                        f"the scorer process did not reply within {timeout_s:g}s; stderr: {process.stderr_tail()}"
                    ) from None
            finally:
                process.pending.pop(request_id, None)


def _forget(state: dict[str, Any]) -> None:
    """When a ``ScorerProcess`` is collected without ``aclose`` (or at exit): its process is killed.
    Its pipes are left to the loop that may still watch them: it sees the end and lets go."""
    process = state.get("_process")
    if process is not None:
        process.kill()
        shutil.rmtree(process.folder, ignore_errors=True)


def _read(fd: int) -> bytes | None:
    """Up to 1 MiB; None when nothing is there yet, ``b""`` at end of file (or a broken pipe)."""
    try:
        return os.read(fd, 1 << 20)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:  # Linux < 5.3: Popen.kill, which checks the process was not reaped
        return None
