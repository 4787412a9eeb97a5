"""The server targets of the stress and perplexity benchmarks as a suite names them (`server:`): a
server kvbench starts (`kvbench serve`, or any command) or one someone else runs (a bare url).
Every url is on the loopback interface unless the target says `remote: true` (a server someone
else runs on another machine, e.g. a cluster node's `kvbench serve --allow-remote --api-key`):
anything else is refused when the suite is validated.

A command's placeholders are filled when the server starts: "{port}" with a free port (in the url
too), "{python}" with the interpreter running kvbench (a server from kvbench's environment),
"{gguf:NAME}" with the path of bundled model NAME's GGUF (e.g. "{gguf:smollm2-135m}"), so that a
suite names them without writing one machine's paths.

A server that asks for an API key gets it as a bearer token, read from the environment variable
the target names (`api_key_env`, default KVBENCH_API_KEY) when a request is sent: the suite, and
so its results, hold the variable's name, never the key."""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from kvbench.config.extras import importable, lacks
from kvbench.config.secrets import API_KEY_ENV, secret_from_env
from kvbench.models.info import bundled_model

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
READY_TIMEOUT_S = 300.0  # for a server to load its model and answer /health
SERVER_KEYS = ("command", "url", "model", "logprobs", "ready_timeout_s", "api_key_env",
               "remote")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
GGUF_PLACEHOLDER = re.compile(r"\{gguf:([^{}]*)\}")  # "{gguf:NAME}": bundled model NAME's GGUF
# servers whose module comes with a kvbench extra, named with its install line when missing
SERVER_EXTRAS = {"kvbench.serve.llama_cpp": "llama-cpp", "llama_cpp.server": "llama-cpp"}


def check_server_url(url: str, remote: bool = False) -> None:
    """ValueError unless `url` is http(s) on 127.0.0.1, localhost or ::1 (any host where
    `remote`) (a `{port}` in it is allowed: the managed server's port fills it)."""
    parsed = urllib.parse.urlsplit(url.replace("{port}", "1"))
    if parsed.scheme not in ("http", "https"):
        raise ValueError(f"server url {url!r} must start with http:// (e.g."
                         " http://127.0.0.1:8000)")
    host = parsed.hostname
    if not host or (not remote and host not in LOOPBACK_HOSTS):
        raise ValueError(f"server url {url!r}: host {host!r} is not loopback; kvbench sends"
                         f" requests only to {', '.join(LOOPBACK_HOSTS)}, or to a server on"
                         " another machine that the target names with `remote: true`")
    try:
        parsed.port
    except ValueError as exc:
        raise ValueError(f"server url {url!r}: {exc}") from None


@dataclass(frozen=True)
class ServerTarget:
    """What `server:` names. kind: "kvbench" (kvbench starts `kvbench serve` with the case's
    model and method), "command" (kvbench starts `command`), "url" (someone else runs it)."""

    kind: str
    command: tuple[str, ...] = ()
    url: str = ""
    model: str | None = None  # the `model` sent in requests; None: left out (the server's own)
    logprobs: bool = False  # ask for top-2 logprobs (kvbench servers always are)
    ready_timeout_s: float = READY_TIMEOUT_S
    api_key_env: str = API_KEY_ENV  # the environment variable holding the server's API key
    remote: bool = False  # its url may be on another machine (a url target only)

    def auth_headers(self) -> dict[str, str]:
        """The bearer token the server asks for, read from the environment now (a suite and
        its results hold the variable's name only); {} where the variable is unset."""
        key = secret_from_env(self.api_key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def describe(self) -> str:
        if self.kind == "kvbench":
            return "kvbench serve (started by kvbench)"
        if self.kind == "command":
            return f"{' '.join(self.command)} (started by kvbench) at {self.url}"
        return f"{self.url} (run by someone else)"


def parse_server(value: str | dict[str, Any]) -> ServerTarget:
    """The target `server:` names; ValueError (naming `server`) for anything else."""
    shapes = ("server must be 'kvbench', {command: [...], url: ...} (a server kvbench starts)"
              " or {url: ...} (one already running)")
    if isinstance(value, str):
        if value != "kvbench":
            raise ValueError(f"{shapes}; got {value!r}")
        return ServerTarget("kvbench")
    if "api_key" in value:
        raise ValueError("server: api_key is not taken (a suite is recorded in its results):"
                         " put the key in an environment variable and name it with api_key_env"
                         f" (default {API_KEY_ENV})")
    unknown = [key for key in value if key not in SERVER_KEYS]
    if unknown:
        raise ValueError(f"server: unknown key {unknown[0]!r}; keys: {', '.join(SERVER_KEYS)}")
    url = value.get("url")
    if not isinstance(url, str) or not url:
        raise ValueError(f"server needs a url string; {shapes}")
    remote = value.get("remote", False)
    if not isinstance(remote, bool):
        raise ValueError(f"server remote must be true or false, got {remote!r}")
    check_server_url(url, remote)
    command = value.get("command")
    if remote and command is not None:
        raise ValueError("server remote: true is for a server someone else runs ({url: ...});"
                         " a server kvbench starts listens on loopback")
    if command is not None and (not isinstance(command, list) or not command
                                or not all(isinstance(part, str) for part in command)):
        raise ValueError("server command must be a non-empty list of strings, e.g."
                         " [python, -m, mlx_lm.server, --port, '{port}']")
    for name in GGUF_PLACEHOLDER.findall(" ".join(command or ())):
        try:
            bundled_model(name)
        except ValueError as exc:
            raise ValueError(f"server command: {{gguf:{name}}}: {exc}") from None
    if command is None and "{port}" in url:
        raise ValueError("server url has {port} but no command: only a server kvbench starts"
                         " gets a port filled in")
    model = value.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"server model must be a string (the name sent in requests), got"
                         f" {model!r}")
    logprobs = value.get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise ValueError(f"server logprobs must be true or false, got {logprobs!r}")
    ready = value.get("ready_timeout_s", READY_TIMEOUT_S)
    if isinstance(ready, bool) or not isinstance(ready, (int, float)) or ready <= 0:
        raise ValueError(f"server ready_timeout_s must be a number > 0, got {ready!r}")
    key_env = value.get("api_key_env", API_KEY_ENV)
    if not isinstance(key_env, str) or not ENV_NAME.fullmatch(key_env):
        raise ValueError(f"server api_key_env must name an environment variable, got {key_env!r}")
    if "api_key_env" in value and secret_from_env(key_env) is None:
        raise ValueError(f"server api_key_env: the environment variable {key_env} is not set"
                         " here (it holds the key sent to the server)")
    return ServerTarget("url" if command is None else "command", tuple(command or ()), url,
                        model, logprobs, float(ready), key_env, remote)


def missing_server_library(target: ServerTarget) -> str | None:
    """Why the command's Python server cannot start here (`... -m MODULE ...` whose module, or
    the kvbench extra it needs, is not installed: its cases are refused), else None."""
    command = target.command
    if "-m" not in command[:-1]:
        return None
    module = command[command.index("-m") + 1]
    extra = SERVER_EXTRAS.get(module)
    if extra:
        return lacks(extra, f"the server {module}")
    return None if importable(module) else f"the server's module {module} is not installed here"
