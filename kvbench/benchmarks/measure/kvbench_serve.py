"""A case's `kvbench serve`: its command, its launch for the model and method, and its /health."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable

from kvbench.benchmarks.measure.servers import Launch


@dataclass(frozen=True)
class ServeOptions:
    """The `kvbench serve` options a benchmark sets; 0 leaves kvbench serve's default."""

    kv_budget: int = 0
    prefill_chunk: int = 0
    prefix_cache: int = 0


def kvbench_serve_command(model: str, method: str, params_json: str, port: int, device: str,
                          threads: int, model_dtype: str = "float32",
                          options: ServeOptions = ServeOptions()) -> list[str]:
    """`kvbench serve` as this interpreter runs it (the same environment as the run)."""
    command = [sys.executable, "-m", "kvbench.cli", "serve", "--model", model,
               "--method", method, "--params", params_json, "--host", "127.0.0.1",
               "--port", str(port), "--device", device, "--threads", str(threads),
               "--model-dtype", model_dtype]
    for flag, value in (("--kv-budget", options.kv_budget),
                        ("--prefill-chunk", options.prefill_chunk),
                        ("--prefix-cache", options.prefix_cache)):
        if value:
            command += [flag, str(value)]
    return command


def kvbench_server(ctx: Any, method: Any, options: ServeOptions,
                   ) -> tuple[tuple[Hashable, ...], str, Callable[[int], Launch]]:
    """(the pool's key, the log's label, the launch) of `kvbench serve` with the case's model
    (ctx: the case's RunContext) and method: one server per method setting and options."""
    import torch

    name = method_name(method.settings)
    params_json = json.dumps(method.settings.params(), sort_keys=True, default=str)
    threads = torch.get_num_threads()
    key = ("kvbench", ctx.model, ctx.model_dtype, name, params_json,
           threads, str(ctx.device), options)

    def launch(port: int) -> Launch:
        # the case's device by name (cuda:1 stays cuda:1); a KVBENCH_API_KEY in this
        # environment reaches the server, which asks for it, as the requests send it
        command = kvbench_serve_command(str(ctx.model), name, params_json, port,
                                        str(ctx.device), threads, ctx.model_dtype, options)
        env = {}
        root = import_root(type(method.settings))
        if root is not None:  # a module:Class method: the server imports it from there
            env["PYTHONPATH"] = path_join(root, os.environ.get("PYTHONPATH", ""))
        return Launch(command, f"http://127.0.0.1:{port}",
                      f"kvbench serve {name} on 127.0.0.1:{port}", env)

    return key, f"kvbench-serve-{name}", launch


def kvbench_server_impl(url: str) -> dict[str, str]:
    """What ran a kvbench server's codec operations so far (its /health `impl`, as a run's
    info.impl); {} when it does not say."""
    return kvbench_server_health(url, "impl")


def kvbench_server_health(url: str, key: str) -> dict[str, Any]:
    """The mapping under `key` in a kvbench server's /health answer; {} when it has none."""
    import httpx

    try:
        with httpx.Client(timeout=10.0, trust_env=False) as client:
            answer = client.get(url + "/health").json()
    except (httpx.HTTPError, ValueError):
        return {}
    found = answer.get(key) if isinstance(answer, dict) else None
    return found if isinstance(found, dict) else {}


def method_name(settings: Any) -> str:
    """The name `kvbench serve --method` builds the method from: its registered name, else
    module:Class of its settings."""
    cls = type(settings)
    return cls.__dict__.get("name") or f"{cls.__module__}:{cls.__qualname__}"


def import_root(cls: type) -> str | None:
    """The sys.path folder a class outside kvbench was imported from (a server started with
    the class's module:Class imports it from there); None for kvbench's own."""
    if cls.__module__.split(".")[0] == "kvbench":
        return None
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    depth = cls.__module__.count(".") + (2 if Path(file).name == "__init__.py" else 1)
    return str(Path(file).resolve().parents[depth - 1])


def path_join(*parts: str) -> str:
    return os.pathsep.join(p for p in parts if p)
