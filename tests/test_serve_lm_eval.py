"""lm-eval's `local-completions`, unchanged, against a real `kvbench serve` on the bundled model:
a loglikelihood task and a generate-until task (tests/data/lm_eval). With identity every
loglikelihood is the model's own (transformers scoring the same tokens itself, no kvbench path)
to 1e-4. With intq bits 4 each is the perplexity benchmark's protocol on the same tokens (the
server's split: the first half prefilled and compressed, the rest scored through the cache one
token at a time), computed in process with the functions that benchmark calls, to 1e-4, and it
moves away from identity's. The generated answers are the server's own to the same prompts."""
import json
import math
import socket

import pytest

from tests.plugins.extras import require_extra

require_extra("serve")

import httpx  # noqa: E402 - after the skip: the serve extra brings it
import torch

lm_eval = pytest.importorskip(
    "lm_eval", reason="lm-eval is not installed: pip install -e '.[dev]' (make install does)")

from kvbench.methods import build_method, implementation  # noqa: E402
from kvbench.models.bundled import bundled_dir  # noqa: E402
from kvbench.models.session import prefill  # noqa: E402
from tests.plugins.cli_support import kvbench_process, wait_until  # noqa: E402
from tests.plugins.suites import ROOT  # noqa: E402
from tests.plugins.waits import healthy  # noqa: E402

# two servers on the bundled model and lm-eval, about 65 s on one core: kept out of the default
# run (CI is near its 20 minutes); `pytest -m slow tests/test_serve_lm_eval.py` runs it
pytestmark = [pytest.mark.model, pytest.mark.slow]

MODEL = "bundled:smollm2-135m"
INTQ = {"bits": 4, "impl": "torch"}  # the fused CPU kernels compile for 20 s a process
TASKS = ["kvbench_choice", "kvbench_until"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """{method: url} of a `kvbench serve` per method, started side by side."""
    procs, urls = {}, {}
    for name, params in (("identity", {}), ("intq", INTQ)):
        port = _free_port()
        procs[name] = kvbench_process(
            ["serve", "--port", port, "--threads", 1, "--calibration", 0, "--method", name,
             "--params", json.dumps(params)], tmp_path_factory.mktemp(name))
        urls[name] = f"http://127.0.0.1:{port}"
    try:
        for name, url in urls.items():
            wait_until(lambda: healthy(url), procs[name], "/health")
        yield urls
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(30)


@pytest.fixture(scope="module")
def evaluated(servers):
    """{method: (the LM lm-eval ran, its samples per task)}: both tasks through each server,
    batches of two prompts per request."""
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    # lm-eval's own thousands of task files are not indexed: the two here are all it needs
    tasks = TaskManager(include_path=str(ROOT / "tests" / "data" / "lm_eval"),
                        include_defaults=False)
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)  # the tasks' data_files are relative to the repository root
        for name, url in servers.items():
            lm = LocalCompletionsAPI(base_url=url + "/v1/completions", model=MODEL,
                                     tokenizer=str(bundled_dir("smollm2-135m")),
                                     tokenizer_backend="huggingface", batch_size=2,
                                     max_retries=1)
            results = simple_evaluate(model=lm, tasks=TASKS, task_manager=tasks,
                                      log_samples=True, bootstrap_iters=0)
            assert set(results["results"]) == set(TASKS)
            out[name] = lm, results["samples"]
    return out


def scored(lm, samples) -> list[tuple[list[int], int, float]]:
    """(the tokens lm-eval sent, its context length, the loglikelihood it read) per choice."""
    rows = []
    for sample in samples["kvbench_choice"]:
        for (context, continuation), [(loglikelihood, _)] in zip(sample["arguments"],
                                                                 sample["resps"]):
            context_ids, continuation_ids = lm._encode_pair(context, continuation)
            rows.append((context_ids + continuation_ids, len(context_ids), loglikelihood))
    return rows


def test_identity_loglikelihoods_are_the_models_own(evaluated):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(bundled_dir("smollm2-135m"),
                                                 dtype=torch.float32)
    lm, samples = evaluated["identity"]
    rows = scored(lm, samples)
    assert len(rows) == 8  # 3 + 2 + 3 choices
    gaps = []
    with torch.inference_mode():
        for ids, context, loglikelihood in rows:
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
            own = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), ids[1:]]
            gaps.append(abs(loglikelihood - own[context - 1:].sum().item()))
    print(f"identity against transformers: at most {max(gaps):.2e}")
    assert max(gaps) <= 1e-4


def protocol(session, method, ids: list[int], split: int, batched: bool) -> list[float]:
    """The perplexity benchmark's protocol on `ids` in process: `split` tokens prefilled
    through a fresh cache of `method` (kvbench.models.session.prefill), then one token at a
    time through it; the logprob of each token after the split. batched: each step as the
    server takes it (session.step_rows), else as the benchmark does (session.step)."""
    cache = session.new_cache(method)
    logits = prefill(session, cache, ids[:split], method)[0][-1]
    logprobs = []
    for at in range(split, len(ids)):
        logprobs.append(torch.log_softmax(logits.double(), -1)[ids[at]].item())
        if at + 1 < len(ids):
            logits = (session.step_rows([ids[at]], [cache])[0] if batched
                      else session.step([ids[at]], cache)[0][-1])
    return logprobs


def test_intq_loglikelihoods_are_the_perplexity_protocols(evaluated, bundled_session):
    """To 1e-4 with the server's batched decode step. The benchmark's batch-1 step runs
    another matrix-product kernel, whose last bits differ; a 4-bit rounding boundary can
    turn that into a few hundredths of a nat, far below what intq moves."""
    method = implementation(build_method("intq", INTQ))
    identity = [ll for _, _, ll in scored(*evaluated["identity"])]
    rows = scored(*evaluated["intq"])
    moved, apart = [], []
    for (ids, context, loglikelihood), plain in zip(rows, identity):
        split = (len(ids) + 1) // 2  # the server's default: the continuation is after it
        assert split <= context
        for batched, within in ((True, 1e-4), (False, 0.05)):
            logprobs = protocol(bundled_session, method, ids, split, batched)
            gap = abs(loglikelihood - math.fsum(logprobs[context - split:]))
            assert gap <= within, (batched, gap)
            apart.append(gap)
        moved.append(abs(loglikelihood - plain))
    print(f"intq4 against identity: {max(moved):.4f}; against the protocol: {apart}")
    assert max(moved) > 0.1  # the agreement above is intq's, not the plain model's


@pytest.mark.parametrize("name", ["identity", "intq"])
def test_generate_until_answers_are_the_servers_own(evaluated, servers, name):
    lm, samples = evaluated[name]
    for sample in samples["kvbench_until"]:
        [(context, kwargs)], [[answer]] = sample["arguments"], sample["resps"]
        reply = httpx.post(servers[name] + "/v1/completions", timeout=120, json={
            "prompt": lm.tok_encode(context), "max_tokens": kwargs["max_gen_toks"],
            "temperature": 0, "stop": ["\n", lm.eos_string]}).json()
        assert answer == reply["choices"][0]["text"]
