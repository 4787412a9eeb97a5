"""With its default settings (impl auto, exact reads, window 0) every layout with a Triton
decode attention is read by it on a CUDA device: no silent fall back to decoding the packed
cache (kvbench.models.host.LayerHost). Here the CPU stands in for CUDA: kvbench.kernels'
use_triton is told the tensors are on CUDA, and the kernels run in Triton's interpreter
(tests/conftest.py). The logits are the reference path's (decode, then SDPA) within float32
rounding; what the run records in info.impl says which read ran."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kvbench.kernels import interpreting  # noqa: E402
from kvbench.methods import build_method, implementation  # noqa: E402
from kvbench.methods.torch import base  # noqa: E402
from tests.plugins.model_runs import rows_and_alone  # noqa: E402

# every layout whose keys and values the Triton decode attention reads, at its defaults
DEFAULTS = [("intq", {}), ("turbo3", {}), ("turbo4", {}), ("lloydmax", {})]


@pytest.fixture
def cuda_like(monkeypatch):
    """impl "auto" decides as it does for CUDA tensors."""
    if not interpreting():
        pytest.skip("the interpreter stands in for CUDA only on a machine without it")
    decide = base.use_triton
    monkeypatch.setattr(base, "use_triton", lambda impl, device, unsupported: decide(
        impl, torch.device("cuda") if device.type == "cpu" else device, unsupported))


@pytest.fixture(scope="module")
def llama_head_128():
    """tiny:llama with heads of 128 values: turbo's default block."""
    from kvbench.models import load_model
    from kvbench.models.tiny_configs import TINY_CONFIGS

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(TINY_CONFIGS, "llama", dict(TINY_CONFIGS["llama"], head_dim=128))
        return load_model("tiny:llama", "cpu")


@pytest.mark.parametrize("name,params", DEFAULTS, ids=[name for name, _ in DEFAULTS])
def test_the_default_settings_take_the_fused_read_on_cuda(name, params, cuda_like,
                                                          llama_head_128):
    from kvbench.models.session import TorchSession

    assert llama_head_128.head_dim == 128
    session = TorchSession(llama_head_128, torch.device("cpu"))
    ids = torch.randint(4, 200, (24,), generator=torch.Generator().manual_seed(3)).tolist()
    logits, logs = {}, {}
    for impl in ("auto", "torch"):
        method = implementation(build_method(name, {**params, **({"impl": impl}
                                                                 if impl == "torch" else {})}))
        cache = session.new_cache(method)
        session.step(ids[:20], cache)
        logits[impl] = torch.cat([session.step([token], cache)[0] for token in ids[20:]])
        logs[impl] = method.impl_log.summary()
    assert logs["auto"]["decode attention"] == "triton"
    assert logs["auto"]["encode"] == "triton"
    assert logs["torch"]["decode attention"] == "torch"
    scale = logits["torch"].abs().max()
    assert (logits["auto"] - logits["torch"]).abs().max() < 1e-5 * scale


def test_the_batched_step_reads_ragged_rows_in_one_triton_call_per_layer(cuda_like,
                                                                         llama_head_128,
                                                                         monkeypatch):
    """The server's batched decode step on CUDA: every row's packed cache (rows of different
    lengths) read by one call of the Triton rows kernel per layer, each row's logits its own
    one-token step's."""
    from kvbench.kernels.triton import rows as triton_rows
    from kvbench.models.session import TorchSession

    calls, read_rows = [], triton_rows.decode_attention_rows
    monkeypatch.setattr(triton_rows, "decode_attention_rows", lambda query, rows, **kw:
                        calls.append(len(rows)) or read_rows(query, rows, **kw))
    session = TorchSession(llama_head_128, torch.device("cpu"))
    method = implementation(build_method("intq", {}))
    prompts = [list(range(5, 40)), list(range(60, 81)), list(range(90, 97))]
    caches, alone = rows_and_alone(session, method, prompts, 7)
    method.impl_log.ran.clear()
    together = session.step_rows([7, 7, 7], caches)
    assert method.impl_log.ran["decode attention"] == {"triton"}
    assert calls == [3] * session.num_layers
    for row, expected in zip(together, alone):
        assert (row - expected).abs().max() < 1e-5 * expected.abs().max()
