"""The run's memo (kvbench.memo): values are made once per key, a key names everything its value
depends on (a value made for one device or model is never served for another), and no module
keeps a cache of its own that would outlive a run."""
import importlib
import importlib.util
import types

import torch

from kvbench.benchmarks import BENCHMARKS, measurement
from kvbench.benchmarks.measure.context import RunContext
from kvbench.benchmarks.specs.compaction import Compaction, CompactionParams
from kvbench.benchmarks.specs.quality import Quality, QualityParams
from kvbench.data.text import text_tokens
from kvbench.memo import Memo
from kvbench.methods import build_method, implementation
from kvbench.models import load_model
from kvbench.models.session import TorchSession


class CountingTokenizer:
    def __init__(self):
        self.calls = 0

    def encode(self, text):
        self.calls += 1
        return [len(text)]


def _session(tokenizer, device="cpu", spec="tiny:llama", backend="torch"):
    return types.SimpleNamespace(tokenizer=tokenizer,
                                 memo_key=(backend, spec, device, "float32"))


def test_a_value_is_made_once_per_key():
    memo, made = Memo(), []
    make = lambda: made.append(1) or len(made)  # noqa: E731
    assert memo.get(("a", 1), make) == 1
    assert memo.get(("a", 1), make) == 1
    assert memo.get(("a", 2), make) == 2
    assert len(made) == 2 and len(memo) == 2


def test_tokens_made_for_one_device_backend_or_model_are_not_served_for_another():
    memo, tokenizer = Memo(), CountingTokenizer()
    text_tokens(memo, _session(tokenizer), "pydoc")
    text_tokens(memo, _session(tokenizer), "pydoc")
    assert tokenizer.calls == 1
    for other in (_session(tokenizer, device="cuda:0"), _session(tokenizer, backend="mlx"),
                  _session(tokenizer, spec="tiny:qwen3")):
        text_tokens(memo, other, "pydoc")
    assert tokenizer.calls == 4


def test_a_session_key_names_backend_model_device_and_dtype():
    loaded = load_model("tiny:llama", "cpu")
    assert TorchSession(loaded, torch.device("cpu")).memo_key == (
        "torch", "tiny:llama", "cpu", "float32")
    assert TorchSession(loaded, torch.device("meta")).memo_key[2] == "meta"


class KeyRecorder(Memo):
    def __init__(self):
        super().__init__()
        self.keys = []

    def get(self, key, make):
        self.keys.append(key)
        return super().get(key, make)


def _load(spec, device, backend="torch", dtype="float32", **loading):
    if backend == "mlx":
        from kvbench.models.mlx_loading import load_mlx_model

        return load_mlx_model(spec)
    return load_model(spec, device, dtype=dtype)


def _ctx(memo, status=lambda message: None):
    return RunContext(device=torch.device("cpu"), seed=0, repeats=1, model="tiny:llama",
                      load_model=_load, status=status, memo=memo)


def test_references_are_shared_through_the_memo_and_keyed_by_the_session():
    memo, statuses = KeyRecorder(), []
    params = QualityParams(context=24, continuation=4, greedy_tokens=3)
    for method in (build_method("identity"), build_method("intq", {"bits": 4})):
        measurement(Quality).run(params, implementation(method), _ctx(memo, statuses.append))
    assert statuses.count("reference") == 1  # the second method reused the first's
    compaction = CompactionParams(trajectory="The tower was finished in 1889.",
                                  task="When?", chat=False, max_new_tokens=3)
    measurement(Compaction).run(compaction, implementation(build_method("identity")), _ctx(memo))
    session_key = ("torch", "tiny:llama", "cpu", "float32")
    names = {key[0] for key in memo.keys}
    assert names == {"text_tokens", "quality.reference", "compaction.plain_answer"}
    assert all(key[1:5] == session_key for key in memo.keys)
    # a context made outside a run has a memo of its own
    measurement(Quality).run(params, implementation(build_method("identity")),
                             _ctx(Memo(), statuses.append))
    assert statuses.count("reference") == 2


MODULES = [
    "kvbench.benchmarks.specs.base", "kvbench.benchmarks.measure.context",
    "kvbench.benchmarks.specs.quality", "kvbench.benchmarks.measure.quality",
    "kvbench.benchmarks.specs.compaction", "kvbench.benchmarks.measure.compaction",
    "kvbench.benchmarks.specs.parity", "kvbench.benchmarks.measure.parity",
    "kvbench.benchmarks.specs.perplexity", "kvbench.benchmarks.measure.perplexity",
    "kvbench.benchmarks.specs.proofs", "kvbench.benchmarks.measure.proofs",
    "kvbench.benchmarks.specs.speed", "kvbench.benchmarks.measure.speed",
    "kvbench.data.text", "kvbench.models.tiny",
    "kvbench.models.loading", "kvbench.models.session", "kvbench.models.capture",
]


def _module_state(names):
    """The size of every module-level dict, set and list of the modules `names`."""
    state = {}
    for name in names:
        for attr, value in vars(importlib.import_module(name)).items():
            assert not hasattr(value, "cache_info"), f"{name}.{attr} is a functools cache"
            if isinstance(value, (dict, set, list)):
                state[f"{name}.{attr}"] = len(value)
    return state


def test_running_benchmarks_leaves_no_state_in_modules():
    """Module state outlives a run and makes tests depend on their order: what a benchmark
    computes goes to the run's memo, never into a module."""
    backends, modules = ["torch"], list(MODULES)
    if importlib.util.find_spec("mlx") is not None:
        backends.append("mlx")
        modules += ["kvbench.models.mlx_host", "kvbench.models.mlx_loading",
                    "kvbench.models.mlx_session"]
    # registration is not a run's state: every built-in registers on import, as lookups do
    for name in BENCHMARKS.builtins:
        importlib.import_module(BENCHMARKS.get(name).measured_in)
    for backend in backends:
        implementation(build_method("identity"), backend)
    before = _module_state(modules)
    for backend in backends:
        ctx = RunContext(device=torch.device("cpu"), seed=0, repeats=1, model="tiny:llama",
                         load_model=_load, backend=backend)
        identity = implementation(build_method("identity"), backend)
        measurement(Quality).run(QualityParams(context=24, continuation=4, greedy_tokens=3),
                                 identity, ctx)
        measurement(Compaction).run(
            CompactionParams(trajectory="The tower was finished in 1889.", task="When?",
                             chat=False, max_new_tokens=3),
            identity, ctx)
    assert _module_state(modules) == before


def test_close_closes_what_has_close_newest_first_and_forgets_everything():
    closed = []

    class Server:
        def __init__(self, name):
            self.name = name

        def close(self):
            closed.append(self.name)

    memo = Memo()
    memo.get(("a",), lambda: Server("a"))
    memo.get(("tokens",), lambda: [1, 2, 3])
    memo.get(("b",), lambda: Server("b"))
    memo.close()
    assert closed == ["b", "a"] and len(memo) == 0
