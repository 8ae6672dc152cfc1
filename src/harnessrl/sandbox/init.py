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


def _pipe(src, dst) -> None:
    import socket

    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _relay(client, unix_path: str) -> None:
    import socket
    import threading

    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(unix_path)
    except OSError:
        client.close()
        upstream.close()
        return
    threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
    _pipe(client, upstream)
    client.close()
    upstream.close()


def _serve(listener, unix_path: str) -> None:
    import threading

    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_relay, args=(client, unix_path), daemon=True).start()


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
            if _executable(command[0]) is None:
                raise FileNotFoundError(f"not found or not executable (PATH={os.environ.get('PATH', '')})")
            _say(status_fd, b"ok\n")  # an exec failing after this (ENOEXEC...) exits 127, as a program would
            os.execvp(command[0], command)
        except OSError as exc:
            _say(status_fd, f"error: cannot start {command[0]!r}: {exc}\n".encode())
            print(f"harnessrl sandbox: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(CANNOT_START)
    if status_fd >= 0:
        os.close(status_fd)
    if listener is not None:
        import threading

        threading.Thread(target=_serve, args=(listener, unix_path), daemon=True).start()
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
