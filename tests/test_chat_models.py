"""Chat and reasoning models, on real tiny checkpoints that answer a script
(tests.plugins.checkpoints.save_scripted_checkpoint: the greedy next token a function of the
current one; Qwen3's chat tokens and a Qwen3-style template with enable_thinking; a
generation_config.json listing <|im_end|> beside the tokenizer's <|endoftext|>). After any token
of a prompt the model opens a think block, thinks " value", closes it, writes a needle's digits
and <|im_end|>, then opens a think block again: it runs on to the budget unless <|im_end|> stops
it. Loaded through kvbench as a checkpoint folder: every answer stops at the generation config's
second id (torch, MLX, the stress client, kvbench serve), the case's system prompt and
chat_template_kwargs reach the tokens fed, and the think block stays in predictions.jsonl while
the score is of what follows it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kvbench.benchmarks import measurement
from kvbench.benchmarks.measure.answering import ChatFrame, answer_all, frame
from kvbench.benchmarks.specs.dataset import Dataset, DatasetParams
from kvbench.data.ruler import make_sample
from kvbench.data.text import load_text
from kvbench.methods import implementation
from kvbench.methods.settings.base import build_method
from kvbench.models import load_model
from kvbench.models.chat import decode_answer, split_reasoning
from kvbench.models.options import ChatOptions
from kvbench.models.session import TorchSession
from kvbench.run.files import PREDICTIONS
from kvbench.run.runner import run_suite
from kvbench.suite.loader import load_suite
from tests.plugins.checkpoints import save_checkpoint, save_scripted_checkpoint
from tests.plugins.model_runs import cpu_context

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SYSTEM = "Answer with the number alone."
CHAT = ChatOptions(SYSTEM, {"enable_thinking": False})
THOUGHT = " value"  # what the model thinks: one token
EMPTY_THINK = "<think>\n\n</think>\n\n"  # Qwen3's template with enable_thinking false
NIAH_LENGTH = 1024
BUDGET = 40


@dataclass(frozen=True)
class Needle:
    seed: int  # niah's data_seed whose needle the model answers
    value: str

    @property
    def said(self) -> str:
        """The answer's text as the model writes it."""
        return f"<think>{THOUGHT}</think>{self.value}"

    @property
    def tokens(self) -> int:
        """Tokens it generates, <|im_end|> not counted: <think>, the thought, </think>, the
        digits."""
        return 3 + len(self.value)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The scripted checkpoints' tokenizer (a script of none)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        save_scripted_checkpoint(tmp_path_factory.mktemp("tokenizer"), {}, "<think>"))


@pytest.fixture(scope="module")
def needle(tokenizer) -> Needle:
    """The first data_seed whose niah_single_2 needle (sample 0 at NIAH_LENGTH, depth 50, framed
    with CHAT as the benchmark frames it) is digits each one token and none twice: a script of
    one successor per token can say it."""
    chat = ChatFrame.of(tokenizer, CHAT)

    def count(sample) -> int:
        return len(frame(tokenizer, chat, sample.context, sample.question,
                         sample.answer_prefix).ids)

    for seed in range(200):
        try:
            sample = make_sample("niah_single_2", 0, length=NIAH_LENGTH, count_tokens=count,
                                 seed=seed, essay=load_text("pydoc"), depth=50.0)
        except ValueError:  # the haystack cannot fill this length exactly enough: the next
            continue
        ids = tokenizer.encode(sample.references[0], add_special_tokens=False)
        if len(set(ids)) == len(ids) == len(sample.references[0]):
            return Needle(seed, sample.references[0])
    raise AssertionError("no needle of distinct digits in 200 seeds")


def scripted(folder: Path, needle: Needle, generation_config: bool = True) -> Path:
    """<think> -> THOUGHT -> </think> -> the needle's digits -> <|im_end|>; after any other
    token, <think>."""
    said = ["<think>", THOUGHT, "</think>", *needle.value, "<|im_end|>"]
    return save_scripted_checkpoint(folder, dict(zip(said, said[1:])), "<think>",
                                    generation_config=generation_config)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, needle) -> Path:
    return scripted(tmp_path_factory.mktemp("scripted"), needle)


@pytest.fixture(scope="module")
def loaded(checkpoint):
    return load_model(str(checkpoint), "cpu")


def identity(backend: str = "torch"):
    return implementation(build_method("identity"), backend)


def ask(session, options: ChatOptions = ChatOptions()):
    """One question framed with `options`, answered greedily within BUDGET tokens."""
    chat = ChatFrame.of(session.tokenizer, options)
    prompt = frame(session.tokenizer, chat, "Remember the number.", "\nWhich number?", "")
    return answer_all(session, identity(session.memo_key[0]), [prompt], "context", [BUDGET])[0]


def test_an_answer_stops_at_the_generation_configs_second_id(tmp_path, loaded, needle):
    tokenizer = loaded.tokenizer
    ends = {tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>")}
    session = TorchSession(loaded, torch.device("cpu"))
    assert session.stop_ids == ends
    answer = ask(session)
    assert answer.generated == needle.tokens and answer.text == needle.said
    assert answer.scored == needle.value
    # without generation_config.json only <|endoftext|> ends it: the model thinks again
    plain = load_model(str(scripted(tmp_path / "plain", needle, generation_config=False)), "cpu")
    session = TorchSession(plain, torch.device("cpu"))
    assert session.stop_ids == {tokenizer.eos_token_id}
    assert ask(session).generated == BUDGET


def test_an_mlx_session_stops_at_the_generation_configs_id_too(checkpoint, needle):
    pytest.importorskip("mlx.core", reason="the mlx extra is not installed")
    from kvbench.models.mlx_loading import load_mlx_model
    from kvbench.models.mlx_session import MLXSession

    session = MLXSession(load_mlx_model(str(checkpoint)))
    assert session.tokenizer.convert_tokens_to_ids("<|im_end|>") in session.stop_ids
    answer = ask(session)
    assert (answer.generated, answer.text, answer.scored) == (needle.tokens, needle.said,
                                                              needle.value)


def write_rows(folder: Path, needle: Needle) -> Path:
    """One dataset row whose reference answer is what the model answers."""
    path = folder / "rows.jsonl"
    path.write_text(json.dumps({"context": f"The number is {needle.value}.",
                                "input": "Which number?", "answers": [needle.value]}) + "\n")
    return path


def needs_datasets() -> None:
    pytest.importorskip("datasets", reason="needs datasets: pip install 'kvbench[datasets]'")


def fed_prompt(loaded, tmp_path: Path, needle: Needle, options: ChatOptions) -> list[int]:
    """The tokens the model is fed for a dataset case's prompt, read at its embedding (the
    prompt's length from the case's predictions record)."""
    needs_datasets()
    fed: list[int] = []
    embed = loaded.model.get_input_embeddings()
    hook = embed.register_forward_hook(lambda module, args, out: fed.extend(
        args[0].flatten().tolist()))
    ctx, kept = cpu_context(loaded=loaded), []
    ctx.chat, ctx.keep = options, kept.append
    try:
        measurement(Dataset).run(DatasetParams(data=str(write_rows(tmp_path, needle)),
                                               metric="exact", answer_tokens=BUDGET),
                                 identity(), ctx)
    finally:
        hook.remove()
    return fed[: kept[0]["prompt_tokens"]]


def test_the_system_prompt_and_template_arguments_reach_the_tokens_fed(tmp_path, loaded, needle):
    tokenizer = loaded.tokenizer
    empty_think = tokenizer.encode(EMPTY_THINK, add_special_tokens=False)
    asked = fed_prompt(loaded, tmp_path, needle, CHAT)
    assert asked[-len(empty_think):] == empty_think  # the answer starts after the empty block
    assert tokenizer.decode(asked).startswith(
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n")
    plain = fed_prompt(loaded, tmp_path, needle, ChatOptions())
    assert plain[-len(empty_think):] != empty_think
    assert tokenizer.decode(plain).startswith("<|im_start|>user\n")
    assert len(asked) - len(plain) == len(empty_think) + len(tokenizer.encode(
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n", add_special_tokens=False))


SUITE = """\
kvbench: 1
name: chat
defaults:
  model: {model}
  device: cpu
  system_prompt: {system}
  chat_template_kwargs: {{enable_thinking: false}}
methods:
  - {{name: identity}}
benchmarks:
  - kind: niah
    params: {{lengths: [{length}], depths: [50], data_seed: {seed}}}
  - kind: dataset
    params: {{data: rows.jsonl, metric: exact, answer_tokens: {budget}}}
"""


def test_a_suite_scores_the_answer_after_the_think_block_and_keeps_both(tmp_path, checkpoint,
                                                                          needle):
    needs_datasets()
    write_rows(tmp_path, needle)
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.format(model=checkpoint, system=json.dumps(SYSTEM), seed=needle.seed,
                                 length=NIAH_LENGTH, budget=BUDGET))
    outcome = run_suite(load_suite(path), tmp_path / "out")
    kept = [json.loads(line) for line in (tmp_path / "out" / PREDICTIONS).read_text()
            .splitlines()]
    assert len(kept) == len(outcome.result.cases) == 2
    for case, record in zip(outcome.result.cases, kept, strict=True):
        assert case.status == "ok", case.error
        assert case.chat == CHAT.record()
        # the needle's value, after the reasoning, is the whole answer scored
        assert case.metrics["score"].value == 100.0
        assert record["references"] == [needle.value]
        assert record["prediction"] == needle.said and record["scored_text"] == needle.value
        assert record["generated"] == needle.tokens  # stopped at <|im_end|>


def test_the_reasoning_split():
    assert split_reasoning("<think>a</think>\n\nb") == split_reasoning("a</think> b") == \
        split_reasoning("a</think>b", opened=True)
    assert split_reasoning("<think>a</think>\n\nb").reasoning == "a"
    assert split_reasoning("<think>a</think>\n\nb").answer == "b"
    assert (split_reasoning("<think>a b").reasoning, split_reasoning("<think>a b").answer) == \
        ("a b", "")  # the budget ran out while thinking: nothing to score
    assert split_reasoning("a b", opened=True).answer == ""  # the prompt opened the block
    assert split_reasoning("x <think>a</think> b").answer == "x b"
    plain = split_reasoning(" 2381946\n")  # no block: the text as it is
    assert (plain.reasoning, plain.answer) == (None, " 2381946\n")


def test_markers_that_are_special_tokens_are_kept_in_the_text(tmp_path):
    from transformers import AutoTokenizer

    # save_checkpoint's tokenizer has <think> and </think> as special tokens
    tokenizer = AutoTokenizer.from_pretrained(save_checkpoint(tmp_path / "special"))
    ids = tokenizer.encode("<think>a</think>b", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "ab"
    assert decode_answer(tokenizer, ids) == "<think>a</think>b"
    assert decode_answer(tokenizer, ids + [tokenizer.eos_token_id]) == "<think>a</think>b"


# Gemma 2's way with a system message: its template raises
NO_SYSTEM_ROLE = (
    "{%- if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{%- endif %}{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_template_without_a_system_role_is_refused_naming_the_model(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        save_checkpoint(tmp_path / "gemma-like", chat_template=NO_SYSTEM_ROLE))
    assert ChatFrame.of(tokenizer, ChatOptions(), "org/gemma-like").before == \
        "<|im_start|>user\n"
    with pytest.raises(ValueError, match="model org/gemma-like: .*a system message: System"
                                         " role not supported"):
        ChatFrame.of(tokenizer, ChatOptions("Be brief."), "org/gemma-like")


def test_the_stress_client_ends_answers_at_the_generation_configs_ids(checkpoint, needle):
    from kvbench.benchmarks.measure import load_generator as lg
    from kvbench.benchmarks.measure.stress_requests import client_tokenizer, request_body
    from kvbench.benchmarks.specs.server_target import parse_server
    from kvbench.benchmarks.specs.stress import StressParams
    from kvbench.memo import Memo

    tokenizer, stops = client_tokenizer(Memo(), str(checkpoint))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert stops == {tokenizer.eos_token_id, im_end}
    record = lg.RequestRecord(0, 0, 0, t_sent=0.0, t_first=0.1, t_end=0.2, status=200)
    record.ids = [5, 6, im_end]  # kvbench serve sends the id that ended the answer
    assert lg.generated_tokens(record, stops) == 2
    task = lg.Task("niah_single_2", (needle.value,), "all", 128, "text")
    assert lg.score_response(needle.said, task) == 100.0
    assert lg.score_response(f"<think>{needle.value}</think> none", task) == 0.0
    prompt = lg.Prompt(0, "text", [5], task)
    body = request_body(StressParams(task="niah_single_2", api="chat"), parse_server("kvbench"),
                        "m", prompt, chat=CHAT)
    assert body["messages"] == [{"role": "system", "content": SYSTEM},
                                {"role": "user", "content": "text"}]
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


# ---- kvbench serve ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(loaded):
    """The url of kvbench serve's app on the scripted model, identity, in a thread: SYSTEM by
    default (--system-prompt) and the think reasoning parser (--reasoning-parser think)."""
    pytest.importorskip("fastapi", reason="needs fastapi: pip install 'kvbench[serve]'")
    from kvbench.serve.app import create_app
    from kvbench.serve.engine import Engine
    from tests.plugins.asgi import AppInThread

    engine = Engine(TorchSession(loaded, torch.device("cpu")), identity())
    app = create_app(engine, "scripted", "identity", loaded.max_context,
                     chat_options=ChatOptions(SYSTEM), reasoning_parser="think")
    engine.start()
    try:
        with AppInThread(app) as running:
            yield running.url
    finally:
        engine.stop()


QUESTION = [{"role": "user", "content": "Which number?"}]


def chat(url: str, **body) -> dict:
    import httpx

    reply = httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "messages": QUESTION, "temperature": 0, "max_tokens": BUDGET, "return_token_ids": True,
        **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def template_tokens(tokenizer, messages, **kwargs) -> int:
    return len(tokenizer.encode(tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs),
        add_special_tokens=False))


def test_serve_frames_with_chat_template_kwargs_and_stops_at_the_second_id(served, loaded,
                                                                           needle):
    tokenizer = loaded.tokenizer
    system = [{"role": "system", "content": SYSTEM}]
    reply = chat(served, chat_template_kwargs={"enable_thinking": False})
    assert reply["usage"]["prompt_tokens"] == template_tokens(
        tokenizer, system + QUESTION, enable_thinking=False)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["token_ids"][-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    # every token generated is counted, the reasoning's and the <|im_end|> that ended it too
    assert reply["usage"]["completion_tokens"] == len(choice["token_ids"]) == needle.tokens + 1
    assert choice["message"]["content"] == needle.value
    assert choice["message"]["reasoning_content"] == THOUGHT
    # without the argument the template thinks; a request's own system message replaces SYSTEM
    assert chat(served)["usage"]["prompt_tokens"] == template_tokens(tokenizer, system + QUESTION)
    own = [{"role": "system", "content": "Be brief."}, *QUESTION]
    assert chat(served, messages=own)["usage"]["prompt_tokens"] == template_tokens(tokenizer, own)


def test_serve_streams_the_reasoning_apart(served, needle):
    import httpx

    deltas = []
    with httpx.stream("POST", served + "/v1/chat/completions", timeout=60, json={
            "messages": QUESTION, "temperature": 0, "max_tokens": BUDGET,
            "stream": True}) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                deltas += [c["delta"] for c in json.loads(line[6:])["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == THOUGHT
    assert "".join(d.get("content", "") for d in deltas) == needle.value


def test_serve_refuses_a_chat_template_kwargs_that_is_not_an_object():
    from tests.plugins.cli_support import invoke

    result = invoke("serve", "--chat-template-kwargs", "[1]")
    assert result.exit_code == 2 and "--chat-template-kwargs: must be a JSON object" in \
        result.output
