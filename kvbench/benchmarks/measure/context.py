"""What a measurement gets and gives: the case's context (device, seed, repeats, the model's
loader, the backend's arrays, the run's memo and where per-sample records and files go), and its
output (metrics, info, and what must match for two runs to be compared)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from kvbench.backends import array_backend
from kvbench.backends.arrays import Arrays
from kvbench.benchmarks.specs.base import TextWindowParams
from kvbench.data.text import token_window
from kvbench.hub import DownloadProgress
from kvbench.memo import Memo
from kvbench.models.footprint import CaseFootprint
from kvbench.models.options import ChatOptions, LoadOptions
from kvbench.models.session import Session, TorchSession, plain_kv_bytes
from kvbench.models.warm_up import warm_up
from kvbench.results import Metric


@dataclass
class RunContext:
    device: torch.device
    seed: int
    repeats: int
    # the suite's model spec (a hub model's at its commit, Org/Name@sha, however the suite named
    # the revision); load it with loaded_model()
    model: str | None
    # (spec, device, backend, dtype, revision, options, progress) -> LoadedModel, or MLXLoaded
    # on mlx (kvbench.run.case.ModelCache); cached by the runner
    load_model: Callable[..., Any]
    status: Callable[[str], None] = lambda message: None  # progress text for the current case
    notice: Callable[[str], None] = lambda message: None  # a line the run's output keeps
    backend: str = "torch"
    # What the run's cases share (tokenised texts, references): the runner's, one per run; a
    # fresh one for a context made outside a run.
    memo: Memo = field(default_factory=Memo)
    # Keeps one per-sample record (a prediction and its score) beside the results, in the run's
    # predictions.jsonl: what a surprising score is read from. Dropped outside a run.
    keep: Callable[[dict[str, Any]], None] = lambda record: None
    # A folder beside the run's results for files a case keeps (a server's log): made on first
    # use by whoever writes there; None outside a run.
    files_dir: Path | None = None
    model_dtype: str = "float32"  # the torch model's dtype (resolved: never auto)
    model_revision: str | None = None  # a hub model's commit
    load_options: LoadOptions = field(default_factory=LoadOptions)
    chat: ChatOptions = field(default_factory=ChatOptions)  # how questions are put to it
    loaded: Any = None  # the model once a measurement has loaded it
    # The case's method (its implementation), whose caches' footprint the case records
    # (kvbench.models.footprint); None: none measured (a context made outside a run).
    footprint_of: Any = None
    footprint: CaseFootprint | None = None  # from the case's first session on

    def loaded_model(self) -> Any:
        """The suite's model on torch, in model_dtype (loaded once per run by the runner)."""
        return self._load("torch")

    def open_session(self) -> Session:
        """The suite's model on the case's backend, as a session (loaded once per run by the
        runner)."""
        if self.model is None:
            raise ValueError("this benchmark needs a model; set the suite's model")
        if self.backend == "mlx":
            from kvbench.models.mlx_session import MLXSession

            session = MLXSession(self._load("mlx"))
        else:
            session = TorchSession(self.loaded_model(), self.device)
        if self.footprint_of is not None:
            self._watch(session)
        return session

    def _watch(self, session: Session) -> None:
        """The case's footprint starts at its first session, the model loaded and its weights
        resident; every session's own reset of the probe restarts it."""
        if self.footprint is None:
            if self.backend == "torch" and self.device.type == "cpu":
                # a memory-mapped checkpoint is read on first use: the first case would count
                # it as its evaluation (MLX's loading evaluates its weights already)
                self.memo.get(("footprint.resident", *session.memo_key),
                              lambda: _read_weights(session))
            method = self.footprint_of
            self.memo.get(("footprint.warm", *session.memo_key, repr(method.settings)),
                          lambda: warm_up(session, method))
            self.footprint = CaseFootprint(session, method,
                                           lambda cache: plain_kv_bytes(session, cache)[1])
        self.footprint.watch(session)

    def _load(self, backend: str) -> Any:
        self.loaded = self.load_model(self.model, self.device, backend=backend,
                                      dtype=self.model_dtype, revision=self.model_revision,
                                      options=self.load_options,
                                      progress=DownloadProgress(self.status, self.notice))
        return self.loaded

    def open_window(self, params: TextWindowParams,
                    need: int) -> tuple[Session, list[int], list[int]]:
        """(a session, `need` tokens of params' text from its offset, the calibration tokens
        right after them: as many of params.calibration as the text has)."""
        session = self.open_session()
        window, after = token_window(self.memo, session, params.text, params.offset, need)
        return session, window, after[: params.calibration]

    @functools.cached_property
    def arrays(self) -> Arrays:
        """The backend's arrays: conversions, synchronised timing, a plain copy (one per
        case)."""
        return array_backend(self.backend, self.device)


def _read_weights(session: TorchSession) -> bool:
    model = session.loaded.model
    for tensor in (*model.parameters(), *model.buffers()):
        tensor.sum()
    return True


@dataclass
class BenchmarkOutput:
    metrics: dict[str, Metric]
    info: dict[str, Any] = field(default_factory=dict)
    # Must match for two runs of the case to be compared (e.g. {"tokens_sha256": ...}).
    comparable: dict[str, str] = field(default_factory=dict)
