"""The servers of the stress and perplexity benchmarks (targets:
kvbench.benchmarks.specs.server_target): a server kvbench starts and stops (`kvbench serve`, or
any command), or one someone else runs.

A managed server runs in its own session (so its process group is its own): stopping it is
SIGTERM to the group, a wait, then SIGKILL, and nothing it started is left behind. It is ready
when GET /health (or, for servers without one, /v1/models) answers 200; the wait is bounded, and
a server that exits early or never gets ready fails with the tail of its log. Its stdout and
stderr go to a log file beside the run's results.

The run's servers are kept in a pool (ServerPool, in the run's memo, which closes it when the run
ends): the cases of a suite come level by level, each level for every method, so each method's
server is started once and waits, idle (memory, no CPU), while the others are measured. Past
the pool's size the least recently used one is stopped first. A command's server is one server
for every case that names the same command, of either benchmark.
"""
from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Hashable

from kvbench.benchmarks.specs.server_target import (
    GGUF_PLACEHOLDER, READY_TIMEOUT_S, ServerTarget, check_server_url,
)
from kvbench.memo import Memo

STOP_WAIT_S = 10.0  # after SIGTERM, before SIGKILL
LOG_TAIL_CHARS = 3000


class ServerError(RuntimeError):
    """A managed server did not start or get ready; the message ends with its log's tail."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fill_port(text: str, port: int) -> str:
    return text.replace("{port}", str(port))


def fill_command(part: str, port: int) -> str:
    """One word of a server command with its placeholders filled: "{port}" with the port,
    "{python}" with this interpreter (kvbench's environment), "{gguf:NAME}" with the path of
    bundled model NAME's GGUF on this machine."""
    part = fill_port(part, port).replace("{python}", sys.executable)
    return GGUF_PLACEHOLDER.sub(lambda found: str(_bundled_gguf(found.group(1))), part)


def _bundled_gguf(name: str) -> Path:
    from kvbench.models.bundled import bundled_gguf

    return bundled_gguf(name)


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(the log {path} cannot be read: {exc})"
    return text[-chars:] if text.strip() else "(the log is empty)"


def _exit_text(code: int) -> str:
    """A process's exit status as a person reads it: "code 3", or the signal that killed it."""
    try:
        name = signal.Signals(-code).name if code < 0 else None
    except ValueError:
        name = None
    if name is None:
        return f"code {code}"
    if name == "SIGILL":  # what a native build for another CPU's instruction set dies of
        return "killed by SIGILL: an instruction this CPU lacks; built for another CPU?"
    return f"killed by {name}"


class RunningServer:
    """A server the load generator can talk to: its base url and how to stop it."""

    url: str
    log_path: Path | None = None
    log_note: str = ""  # where the log is, when that is not beside the results
    description: str = ""
    warmed: bool = False  # the stress benchmark sent its warm-up request

    def close(self) -> None:
        """Stop it (a server someone else runs is left running)."""


class ExternalServer(RunningServer):
    def __init__(self, url: str, description: str, remote: bool = False):
        check_server_url(url, remote)
        self.url, self.description = url.rstrip("/"), description


class ManagedServer(RunningServer):
    """A process kvbench started; `start` returns once it answers /health (or /v1/models)."""

    def __init__(self, command: list[str], url: str, log_path: Path, description: str,
                 env: dict[str, str] | None = None, ready_timeout_s: float = READY_TIMEOUT_S,
                 headers: dict[str, str] | None = None):
        check_server_url(url)
        self.command, self.url = command, url.rstrip("/")
        self.log_path, self.description, self.env = log_path, description, env
        self.ready_timeout_s = ready_timeout_s
        self.headers = headers or {}  # its API key, for a server whose /v1/models asks one
        self.process: subprocess.Popen | None = None
        self.ready_s: float | None = None

    def start(self) -> "ManagedServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"# kvbench {stamp}: starting {subprocess.list2cmdline(self.command)}\n"
                      .encode())
            log.flush()
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
            # Its own session: its own process group (stopped as a whole), and a terminal's
            # Ctrl-C reaches kvbench only, which stops it.
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True)
        started = time.monotonic()
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        self.ready_s = time.monotonic() - started
        return self

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + self.ready_timeout_s
        with httpx.Client(timeout=5.0, trust_env=False, headers=self.headers) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise ServerError(f"the server exited ({_exit_text(code)}) before it was"
                                      f" ready: {self._what()}")
                try:
                    status = client.get(self.url + "/health").status_code
                    if status in (404, 405):  # no /health: a server that lists its models is up
                        status = client.get(self.url + "/v1/models").status_code
                    if status == 200:
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    raise ServerError(f"the server was not ready within"
                                      f" {self.ready_timeout_s:g} s: {self._what()}")
                time.sleep(0.25)

    def _what(self) -> str:
        return (f"{subprocess.list2cmdline(self.command)}; its log {self.log_path} ends:\n"
                f"{log_tail(self.log_path)}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def close(self) -> None:
        """SIGTERM to its process group, up to STOP_WAIT_S, then SIGKILL. Idempotent."""
        process, self.process = self.process, None
        if process is None:
            return
        pgid = process.pid  # start_new_session: the group is the child's own
        _signal_group(pgid, signal.SIGTERM)
        try:
            process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(pgid, signal.SIGKILL)  # whatever is left of the group, the leader too
        process.wait()
        with open(self.log_path, "ab") as log:
            log.write(f"# kvbench: stopped (exit code {process.returncode})\n".encode())


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


class ServerPool:
    """The run's servers by key, at most `size` of them: `acquire` hands back the server for a
    key, starting it (after stopping the least recently used one when the pool is full) when
    there is none or it died."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.servers: dict[tuple[Hashable, ...], RunningServer] = {}  # least recently used first

    def acquire(self, key: tuple[Hashable, ...],
                make: Callable[[], RunningServer]) -> tuple[RunningServer, bool]:
        """(the server for `key`, whether it was started just now)."""
        server = self.servers.pop(key, None)
        if server is not None and (not isinstance(server, ManagedServer) or server.running):
            self.servers[key] = server
            return server, False
        if server is not None:
            server.close()
        while len(self.servers) >= self.size:
            self.servers.pop(next(iter(self.servers))).close()
        self.servers[key] = server = make()
        return server, True

    def close(self) -> None:
        servers, self.servers = list(self.servers.values()), {}
        for server in servers:
            server.close()


# ---- the run's servers: one per target, kept in the run's pool --------------------------------

POOL_MEMO_KEY = ("servers",)  # where the run's memo holds its ServerPool


@dataclass
class Launch:
    """How to start one server on the port kvbench picked."""

    command: list[str]
    url: str
    description: str
    env: dict[str, str] = field(default_factory=dict)


def command_launch(target: ServerTarget, port: int) -> Launch:
    """A `command` target's launch: its command and url with their placeholders filled."""
    return Launch([fill_command(part, port) for part in target.command],
                  fill_port(target.url, port), target.describe())


def pooled_server(memo: Memo, files_dir: Path | None, target: ServerTarget,
                  key: tuple[Hashable, ...] | None = None, label: str = "",
                  launch: Callable[[int], Launch] | None = None,
                  ) -> tuple[RunningServer, dict[str, Any]]:
    """(the run's server for `target` from the pool in `memo`, what a case's info says of it).
    A managed one is started (and waited for) when the pool has none for `key` or it died, its
    log in `files_dir`. key, label (the log's name) and launch(port) default to the target's:
    (target_key), the command's program (`program`), `command_launch`."""
    key = key or target_key(target)
    if target.kind == "url":
        make: Callable[[], RunningServer] = partial(ExternalServer, target.url,
                                                    target.describe(), target.remote)
    else:
        label = label or f"{target.kind}-{program(target.command)}"
        make = partial(_start, files_dir, label, key, launch or partial(command_launch, target),
                       target.ready_timeout_s, target.auth_headers())
    server, fresh = memo.get(POOL_MEMO_KEY, ServerPool).acquire(key, make)
    info: dict[str, Any] = {
        "server": target.describe(),
        "server_log": None if server.log_path is None else str(server.log_path),
    }
    if server.log_note:
        info["server_log_note"] = server.log_note
    info["server_started_for_this_case"] = fresh
    if fresh and isinstance(server, ManagedServer):
        info["server_ready_s"] = server.ready_s
        info["server_command"] = server.command
    return server, info


def target_key(target: ServerTarget) -> tuple[Hashable, ...]:
    """The pool's key of a command or url target: one server for every case that names it."""
    return (target.kind, target.command, target.url)


def program(command: tuple[str, ...] | list[str]) -> str:
    """What a command runs, for a log's name: its module for `python -m module`, else its
    program's file name."""
    if len(command) > 2 and command[1] == "-m":
        return command[2]
    return Path(command[0]).name


def server_log_path(files_dir: Path | None, label: str,
                    key: tuple[Hashable, ...]) -> tuple[Path, str]:
    """(where a started server's log goes, a note when that is not beside the results)."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:8]
    name = re.sub(r"[^\w.-]+", "_", label)[:80] + f"-{digest}.log"
    if files_dir is not None:
        return Path(files_dir) / name, ""
    folder = Path(tempfile.mkdtemp(prefix="kvbench-server-"))
    return folder / name, "no run folder (outside a run): the server's log is a temp file"


def _start(files_dir: Path | None, label: str, key: tuple[Hashable, ...],
           launch: Callable[[int], Launch], ready_timeout_s: float,
           headers: dict[str, str]) -> ManagedServer:
    log, note = server_log_path(files_dir, label, key)
    how = launch(free_port())
    server = ManagedServer(how.command, how.url, log, how.description, how.env, ready_timeout_s,
                           headers)
    server.log_note = note
    return server.start()
