"""Test-only benchmarks and a method for the CLI and runner tests; no model, no real work.

Suites name them with `module:Class` strings, e.g. `kind: tests.plugins.kvb_testplugin:Crash`,
so nothing is registered globally and a subprocess finds them with the repo root on PYTHONPATH.
"""
from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from kvbench.benchmarks.measure.context import BenchmarkOutput
from kvbench.benchmarks.records.base import Record
from kvbench.benchmarks.specs.base import Benchmark, MetricSpec
from kvbench.config.fields import LibraryMissing, Settings, at_least, param
from kvbench.methods.core.contracts import Implementation
from kvbench.methods.core.wrapped_policy import WrappedPolicy
from kvbench.methods.settings import MethodSettings, implements
from kvbench.methods.settings.identity import Identity
from kvbench.methods.torch.identity import TorchIdentity

CRASH_MESSAGE = "kvb_testplugin: deliberate crash"


@dataclass
class Nop(MethodSettings):
    """A method with one knob that does nothing; the test benchmarks report it back."""

    knob: int = param(1, range=at_least(0), meaning="reported back, nothing else")


@implements(Nop)
class NopMethod(Implementation):
    def new_layer_cache(self, layer_idx):
        raise NotImplementedError("Nop is for test benchmarks only")


ABSENT_LIBRARY = "method 'Unbuildable' needs the absentlib extra (no module absentlib)"


@dataclass
class Unbuildable(Nop):
    """A method whose library is never installed: the suite refuses its cases, not itself."""

    def check(self) -> None:
        raise LibraryMissing("knob", ABSENT_LIBRARY)


@dataclass
class StepParams:
    """i: an index to tell cases apart; sleep_s: how long run() takes; log: a file each run
    appends its case index to (relative to the working folder; "" for none)."""

    i: int = 0
    sleep_s: float = 0.0
    log: str = ""


def _sleep(seconds: float) -> None:
    """Sleep in small steps so that signals (SIGALRM, SIGINT) land promptly."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(0.02, max(0.0, end - time.monotonic())))


# The case whose index this names blocks after logging its start, until the process is
# signalled: the interrupt tests stop a run mid-case without depending on timing.
BLOCK_AT = "KVB_BLOCK_AT"
BLOCK_LIMIT_S = 120.0


class Step(Benchmark):
    """Appends its index to `log`, sleeps (or blocks, see BLOCK_AT), and reports values drawn
    from the seeded RNGs."""

    Params = StepParams
    metrics = {
        "value": MetricSpec("", "lower", "the case index i"),
        "rand_py": MetricSpec("", "none", "random.random() after seeding"),
        "rand_np": MetricSpec("", "none", "np.random.rand() after seeding"),
        "rand_torch": MetricSpec("", "none", "torch.rand(()) after seeding"),
    }

    def run(self, params, method, ctx):
        if params.log:
            with open(Path(params.log), "a") as fh:
                fh.write(f"{params.i}\n")
                fh.flush()
        _sleep(BLOCK_LIMIT_S if os.environ.get(BLOCK_AT) == str(params.i) else params.sleep_s)
        m = self.metrics
        return BenchmarkOutput(
            metrics={
                "value": m["value"].of(params.i),
                "rand_py": m["rand_py"].of(random.random()),
                "rand_np": m["rand_np"].of(float(np.random.rand())),
                "rand_torch": m["rand_torch"].of(float(torch.rand(()))),
            },
            info={"seed": ctx.seed, "method": type(method.settings).__name__},
        )


@dataclass
class UnbuildableParams(StepParams, Settings):
    """Step's parameters, needing a library that is never installed."""

    def check(self) -> None:
        raise LibraryMissing(None, ABSENT_LIBRARY)


class Unreachable(Step):
    """A benchmark whose settings need a library not installed: its cases are refused."""

    Params = UnbuildableParams


class Crash(Step):
    """Always raises ValueError(CRASH_MESSAGE) from a nested call."""

    def run(self, params, method, ctx):
        _explode(params.i)


def _explode(i: int):
    raise ValueError(f"{CRASH_MESSAGE} (i={i})")


class Segfault(Step):
    """Kills its own process with SIGSEGV, as a crash in native code would."""

    def run(self, params, method, ctx):
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)


class Hang(Step):
    """Blocks SIGALRM, then sleeps for sleep_s: a hang the in-process timeout cannot stop."""

    def run(self, params, method, ctx):
        import signal

        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(params.sleep_s)


class DiesOnce(Step):
    """The first time (no file at `log` yet): writes its pid there, then blocks until its process
    is killed from outside. Every later time: what Step does, without the log."""

    def run(self, params, method, ctx):
        marker = Path(params.log)
        if not marker.exists():
            marker.write_text(f"{os.getpid()}\n")
            _sleep(BLOCK_LIMIT_S)
        return super().run(replace(params, log=""), method, ctx)


class Keeps(Step):
    """Reports its progress and keeps one per-sample record, then does what Step does."""

    def run(self, params, method, ctx):
        ctx.status(f"sample of case {params.i}")
        ctx.keep({"i": params.i, "pid": os.getpid()})
        return super().run(params, method, ctx)



# A folder: where it holds a file `count`, each Meets case writes its index there (at-I), then
# waits until `count` cases have: it goes on only when that many run at once. Unset, or no
# `count` there (a serial run), a Meets case does what Step does.
MEET = "KVB_MEET"
MEET_LIMIT_S = 900.0  # a hang, not a stopwatch: the meeting fails only if never all there


def meeting(folder: Path, count: int) -> None:
    """Sets `folder` up for a meeting of `count` cases (the next run's Meets cases)."""
    folder.mkdir(parents=True, exist_ok=True)
    for arrived in folder.glob("at-*"):
        arrived.unlink()
    (folder / "count").write_text(str(count))


class Meets(Step):
    """Meets the other cases running at once (MEET), then does what Step does; its expected
    cost is its index i (kvbench.run.cost), so the longest-first order is known."""

    def workload(self, params) -> float:
        return float(params.i)

    def run(self, params, method, ctx):
        here = Path(os.environ.get(MEET, "")) if os.environ.get(MEET) else None
        if here is not None and (here / "count").exists():
            count = int((here / "count").read_text())
            (here / f"at-{params.i}").write_text(str(os.getpid()))
            deadline = time.monotonic() + MEET_LIMIT_S
            while len(list(here.glob("at-*"))) < count:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {len(list(here.glob('at-*')))} of {count} met")
                _sleep(0.05)
        return super().run(params, method, ctx)


class DeclaredRecord(Record):
    kept: int


class Declares(Step):
    """Declares its record, then writes what `params.i` says: 0 what it declares, 1 a key it
    does not declare, 2 a declared key of the wrong type."""

    record = DeclaredRecord

    def run(self, params, method, ctx):
        info = [{"kept": 7}, {"kept": 7, "stray": 1}, {"kept": "seven"}][params.i]
        return BenchmarkOutput(metrics=super().run(params, method, ctx).metrics, info=info)


class NonFinite(Benchmark):
    """Reports NaN, +inf and -inf beside a finite value: for the round trip of results files."""

    Params = StepParams
    metrics = {
        "finite": MetricSpec("", "lower", "1.5"),
        "nan": MetricSpec("", "lower", "NaN"),
        "inf": MetricSpec("", "lower", "+inf"),
        "neg_inf": MetricSpec("", "higher", "-inf"),
    }

    def run(self, params, method, ctx):
        m = self.metrics
        values = {"finite": 1.5, "nan": math.nan, "inf": math.inf, "neg_inf": -math.inf}
        return BenchmarkOutput(metrics={name: m[name].of(v) for name, v in values.items()})


@dataclass
class SharedCache(Identity):
    """A deliberately broken method: its layer caches hand attention their keys and values in a
    scratch buffer per layer shared by every sequence (as a careless fused kernel might). One
    sequence at a time never notices; when a server batches two, each row is read after the
    next row has overwritten the buffer, so sequences attend to each other's tokens: a leak
    between sessions that the stress benchmark's correctness-under-load check must catch."""


@implements(SharedCache)
class SharedCacheMethod(TorchIdentity):
    def __init__(self, settings, on):
        super().__init__(settings, on)
        self.scratch: dict[int, list] = {}

    def new_layer_cache(self, layer_idx):
        return ScratchReads(super().new_layer_cache(layer_idx),
                            self.scratch.setdefault(layer_idx, [None, None]))


class ScratchReads(WrappedPolicy):
    def __init__(self, inner, scratch: list):
        super().__init__(inner)
        self.scratch = scratch  # [keys buffer, values buffer], shared

    def attention_inputs(self):
        keys, values, bias = self.inner.attention_inputs()
        return self._into(0, keys), self._into(1, values), bias

    def _into(self, slot: int, x: torch.Tensor) -> torch.Tensor:
        buffer = self.scratch[slot]
        if buffer is None or buffer.shape[-2] < x.shape[-2] or buffer.shape[:-2] != x.shape[:-2]:
            buffer = self.scratch[slot] = x.new_empty(*x.shape[:-2], max(4096, x.shape[-2]),
                                                      x.shape[-1])
        view = buffer[..., : x.shape[-2], :]
        view.copy_(x)
        return view
