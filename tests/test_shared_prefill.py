"""A prompt prefilled once and handed to every method that shares the plain prefill
(kvbench.models.shared_prefill): the same answers, bit for bit, as each method's own prefill,
on torch and on MLX."""
from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvbench.benchmarks.measure.answering import Prompt, answer_all
from kvbench.methods import implementation
from kvbench.methods.settings.base import build_method
from kvbench.models.shared_prefill import (PREFIX, PrefillStore, prefill_plain,
                                          remove_orphaned_stores)
from kvbench.models.session import shares_prefill
from tests.plugins.model_runs import methods_on

pytestmark = pytest.mark.model

# suites/ruler.yaml's methods, and a stored-reads codec, which must prefill itself
RULER_METHODS = [
    ("identity", {}), ("intq", {"bits": 4, "group_size": 32, "axis": "token"}),
    ("kivi", {"bits": 2, "group_size": 32, "residual": 128}), ("turbo3", {"block": 64}),
    ("streamingllm", {"ratio": 0.25}), ("streamingllm", {"ratio": 0.5}),
    ("snapkv", {"ratio": 0.25}), ("snapkv", {"ratio": 0.5}), ("h2o", {"ratio": 0.25}),
    ("h2o", {"ratio": 0.5}), ("am_task", {"ratio": 0.25}), ("am_task", {"ratio": 0.5}),
    ("butterfly", {}), ("intq", {"bits": 2, "prefill_reads": "stored"}),
]
QUICK = [RULER_METHODS[i] for i in (1, 6, 8, 13)]


def _prompt(tokenizer) -> Prompt:
    context = tokenizer.encode("The special magic number is 7421. "
                               + "The grass is green and the sky is blue. " * 30)
    return Prompt(context, tokenizer.encode(" What is the special magic number? Answer:"))


def _same_answers(session, methods, store, chunk=0):
    prompt = _prompt(session.tokenizer)
    store.expect(session, [prompt.context, prompt.ids], chunk)  # later methods read them
    for method in methods:
        for compress in ("context", "all"):
            own = answer_all(session, method, [prompt], compress, [8], chunk=chunk)
            shared = answer_all(session, method, [prompt], compress, [8], shared=store,
                                chunk=chunk)
            assert shared == own, (method.name, method.settings, compress)


# MLX on the bundled model is slow here (a reference BLAS): the quick test takes the tiny model;
# the bundled model on torch (~20-50 s) is in the slow run
@pytest.mark.parametrize("session_fixture", [
    pytest.param("bundled_session", marks=pytest.mark.slow), "tiny_mlx_session"])
def test_shared_prefill_answers_as_each_method_alone(request, session_fixture):
    session = request.getfixturevalue(session_fixture)
    methods = methods_on(session.memo_key[0], QUICK)
    assert len(methods) == len(QUICK)  # every quick method runs on both backends
    store = PrefillStore()
    try:
        _same_answers(session, methods, store)
        # one recorded forward per prompt half (context, all), reused by every other method
        # that shares it; h2o reads every query of the prompt: it prefills itself
        sharing = [m for m in methods if shares_prefill(session, m)]
        assert [m.name for m in methods if m not in sharing] == ["h2o", "intq"]
        # snapkv asks for its window's queries after intq recorded none: made again
        assert store.made == 4
        assert store.reused == 2 * len(sharing) - 4
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("session_fixture", ["bundled_session", "bundled_mlx_session"])
def test_every_ruler_method_answers_alike_through_the_shared_prefill(request, session_fixture):
    session = request.getfixturevalue(session_fixture)
    store = PrefillStore()
    try:
        _same_answers(session, methods_on(session.memo_key[0], RULER_METHODS), store)
    finally:
        store.close()


def test_which_methods_share_the_plain_prefill():
    def shares(name, **params):
        return implementation(build_method(name, params), "torch").shares_prefill

    assert all(shares(n, **p) for n, p in RULER_METHODS[:12])  # as one forward
    assert shares("decay") and shares("adaptive") and shares("lloydmax")
    # stored reads attend the prompt through its own quantized copy; sparse-V's prefill is its
    # base's (it skips rows at one-token steps only); butterfly is not verified
    assert not shares("intq", prefill_reads="stored")
    assert shares("identity", prefill_reads="stored")  # never packs: nothing is lossy
    assert shares("sparse_v") and not shares("sparse_v", base="intq",
                                                 base_params={"prefill_reads": "stored"})
    assert not shares("butterfly")


def test_a_method_shares_the_plain_prefill_on_mlx_as_on_torch():
    pytest.importorskip("mlx.core", reason="the mlx extra is not installed")
    on_mlx = methods_on("mlx", RULER_METHODS)
    assert {m.name for m in on_mlx} >= {"identity", "intq", "kivi", "h2o", "am_task", "butterfly"}
    for method in on_mlx:
        assert method.shares_prefill == implementation(method.settings, "torch").shares_prefill


def test_the_store_drops_the_oldest_prompt_beyond_its_budget(bundled_session):
    ids = [list(range(5, 5 + n)) for n in (20, 21, 22)]
    sizes = []
    store = PrefillStore(budget=1 << 40)
    try:
        store.expect(bundled_session, ids)
        for i in ids:
            prompt = store.get(bundled_session, i)
            sizes.append(sum(t.numel() * t.element_size() for layer in prompt.layers
                             for t in layer if t is not None))
        assert (store.made, store.reused) == (3, 0)
        again = store.get(bundled_session, ids[0])
        assert store.reused == 1
    finally:
        store.close()
    small = PrefillStore(budget=sizes[1] + sizes[2])
    try:
        for i in ids:  # one case each, read again later: an earlier case's may be dropped
            small.expect(bundled_session, [i])
            small.get(bundled_session, i)
        small.expect(bundled_session, [ids[0]])
        first = small.get(bundled_session, ids[0])  # dropped for the two newer ones: made again
        assert (small.made, small.reused) == (4, 0)
        assert torch.equal(first.logits, again.logits)
        assert all(torch.equal(a, b) for la, lb in zip(first.layers, again.layers)
                   for a, b in zip(la[:2], lb[:2]))
        assert first.queries == again.queries == 0
    finally:
        small.close()
    assert not small.folder.exists()


def test_a_case_whose_prompts_do_not_fit_keeps_its_first_ones(bundled_session):
    first, second, later = ([list(range(5 + k, 25 + k + n)) for n in range(3)] for k in (0, 50, 99))
    size = sum(t.numel() * t.element_size() for layer in
               prefill_plain(bundled_session, first[2]).layers for t in layer if t is not None)
    store = PrefillStore(budget=2 * size)  # two of a case's three prompts
    try:
        for prompts in (first, second):
            store.expect(bundled_session, prompts)
            for method in range(3):  # each method asks for the case's prompts in order
                for ids in prompts:
                    store.get(bundled_session, ids)
        # each case: three made by its first method, two reused by each later one, one made again
        assert (store.made, store.reused) == (2 * (3 + 2), 2 * 4)
        store.expect(bundled_session, later)
        store.get(bundled_session, later[0])
        store.get(bundled_session, later[0])  # the other case's prompts made room for it
        assert (store.made, store.reused) == (11, 9)
    finally:
        store.close()


def test_a_store_nobody_closed_is_removed_when_collected_or_at_exit():
    store = PrefillStore()
    folder = store.folder
    assert folder.is_dir()
    del store
    assert not folder.exists()
    made = ("from kvbench.models.shared_prefill import PrefillStore\n"
            "store = PrefillStore()\nprint(store.folder, flush=True)\n")
    exits, killed = (subprocess.run([sys.executable, "-c", made + end], capture_output=True,
                                    text=True, check=True).stdout.strip()
                     for end in ("", "import os; os._exit(0)"))  # as a kill: no cleanup
    assert exits and not os.path.exists(exits)
    assert os.path.isdir(killed)
    remove_orphaned_stores(Path(killed).parent)
    assert not os.path.exists(killed)


def test_a_store_left_by_a_killed_process_is_removed_and_no_other(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    host = socket.gethostname()
    names = {"orphan": f"{PREFIX}{host}-{gone}-abc", "mine": f"{PREFIX}{host}-{os.getpid()}-abc",
             "other host": f"{PREFIX}elsewhere-{gone}-abc", "unnamed": f"{PREFIX}abc_12"}
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "prompt.pt").write_bytes(b"x")
    assert remove_orphaned_stores(tmp_path) == [tmp_path / names["orphan"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        name for what, name in names.items() if what != "orphan")


def test_a_prompt_in_chunks_is_shared_by_the_methods_that_keep_it_whole(tiny_sessions):
    """Fed in forwards of 48 tokens: snapkv takes the recorded chunks (its answers as its own
    chunked prefill's, bit for bit); intq encodes as the prompt comes, so a later chunk reads
    the earlier ones packed: it prefills itself."""
    session = tiny_sessions("llama")
    methods = methods_on("torch", [RULER_METHODS[i] for i in (6, 1, 0)])
    prompt = _prompt(session.tokenizer)
    assert len(prompt.context) > 3 * 48
    assert [shares_prefill(session, m, len(prompt.context), 48) for m in methods] == [
        True, False, True]
    assert shares_prefill(session, methods[1], len(prompt.context), len(prompt.context))
    store = PrefillStore()
    try:
        _same_answers(session, methods, store, chunk=48)
        # recorded for snapkv with its window's queries; identity reads none of them
        assert (store.made, store.reused) == (2, 2)
    finally:
        store.close()


def test_the_recording_keeps_only_the_newest_queries_asked_for(tiny_sessions):
    session = tiny_sessions("llama")
    ids = _prompt(session.tokenizer).context
    every = prefill_plain(session, ids, chunk=40, queries=len(ids))
    window = prefill_plain(session, ids, chunk=40, queries=5)
    none = prefill_plain(session, ids, chunk=40)
    assert none.queries == 0 and all(q is None for _, _, q in none.layers)
    assert window.queries == 5 and every.queries == len(ids)
    for (k, v, q), (k5, v5, q5), (k0, v0, _) in zip(every.layers, window.layers, none.layers):
        assert torch.equal(q[..., -5:, :], q5) and q5.is_contiguous()
        assert torch.equal(k, k5) and torch.equal(k, k0) and torch.equal(v, v0)
    # in chunks or in one forward: the same keys up to rounding, the first layer's exactly
    whole = prefill_plain(session, ids)
    assert torch.equal(whole.layers[0][0], every.layers[0][0])
    for (k, v, _), (kw, vw, _) in zip(every.layers, whole.layers):
        torch.testing.assert_close(k, kw, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, vw, rtol=1e-5, atol=1e-5)


def test_a_method_handed_the_recorded_prompt_leaves_it_as_it_was(tiny_sessions):
    """No copy is made for a method (LayerCachePolicy.append: never written into): the next
    method is handed the same arrays, which every sharing method leaves unchanged through its
    prefill, compaction and decode."""
    from kvbench.models.session import prefill

    session = tiny_sessions("llama")
    ids = _prompt(session.tokenizer).context
    recorded = prefill_plain(session, ids, queries=64)
    before = [[None if t is None else t.clone() for t in layer] for layer in recorded.layers]
    tiny_head = [(n, {"block": 16} if n == "turbo3" else p) for n, p in RULER_METHODS]
    methods = [m for m in methods_on("torch", tiny_head) if shares_prefill(session, m)]
    assert len(methods) == 10
    for method in methods:
        cache = session.new_cache(method)
        last, _, _ = prefill(session, cache, ids, method, prefilled=recorded)
        token = int(last[-1].argmax())
        for _ in range(3):
            token = int(session.step([token], cache)[0][-1].argmax())
        assert cache.accounted_bytes() > 0
        for layer, saved in zip(recorded.layers, before):
            assert all(torch.equal(a, b) for a, b in zip(layer, saved) if a is not None), \
                method.name


def test_the_recording_is_let_go_before_the_method_compacts(tiny_sessions, monkeypatch):
    """Answering holds the shared recording only through prefill(), which lets it go before
    end_prefill: a compacting method then frees each layer's whole prompt as it keeps its part
    (the recording's views held every layer's whole keys and values beside the kept copies:
    at 32k on the 8B shape a quarter of the plain cache more at the peak)."""
    from kvbench.benchmarks.measure.answering import prefill_through

    session = tiny_sessions("llama")
    ids = _prompt(session.tokenizer).context
    method = implementation(build_method("streamingllm", {"ratio": 0.25}), "torch")
    store = PrefillStore()
    handed, alive_at_compaction = [], []
    get, end_prefill = store.get, session.end_prefill

    def recording(*args, **kwargs):
        prompt = get(*args, **kwargs)
        handed.append(weakref.ref(prompt))
        return prompt

    def compaction(cache):
        alive_at_compaction.append(handed[0]() is not None)
        return end_prefill(cache)

    monkeypatch.setattr(store, "get", recording)
    monkeypatch.setattr(session, "end_prefill", compaction)
    try:
        prefill_through(session, session.new_cache(method), ids, method, 0, store)
    finally:
        store.close()
    assert alive_at_compaction == [False]


def test_a_prompt_no_later_case_reads_is_never_stored(tiny_sessions):
    from kvbench.benchmarks.measure.retrieval import Reader
    from kvbench.benchmarks.specs.ruler import RulerParams
    from kvbench.memo import Memo
    from kvbench.models.options import ChatOptions

    session = tiny_sessions("llama")
    ids = _prompt(session.tokenizer).context
    identity, snapkv, h2o = (implementation(build_method(n, p), "torch")
                             for n, p in [RULER_METHODS[i] for i in (0, 6, 8)])
    params = RulerParams(task="niah_single_1", length=512)

    def later(*cases):
        memo = Memo()
        memo.later = tuple(SimpleNamespace(params=p, backend="torch", chat=ChatOptions(),
                                           settings=m.settings) for p, m in cases)
        reader = Reader(SimpleNamespace(memo=memo, backend="torch", chat=ChatOptions()),
                        session, None, "")
        store = reader.shared_prefill(identity, [ids], params, 0)
        store.get(session, ids)
        store.get(session, ids)
        counts = store.made, store.stored, store.reused
        store.close()
        return counts

    assert later() == (2, 0, 0)  # the run's last case: made for it alone, never written
    assert later((dataclasses.replace(params, length=1024), snapkv)) == (2, 0, 0)  # other prompts
    assert later((params, h2o)) == (2, 0, 0)  # a method that prefills itself
    assert later((params, snapkv)) == (1, 1, 1)
    reader = Reader(SimpleNamespace(memo=Memo(), backend="torch", chat=ChatOptions()), session,
                    None, "")
    assert reader.shared_prefill(h2o, [ids], params, 0) is None


@pytest.mark.parametrize("name", ["identity", "snapkv"])
def test_the_first_cache_handed_a_recording_takes_its_arrays_over_and_writes_after_them(
        tiny_sessions, name):
    """Recorded with room for what follows (as answering reserves it), a prompt's arrays become
    the first ingesting cache's own: its keys are the recording's storage, its decode steps are
    written into the room after the prompt, and a later cache handed the same prompt reads it
    unchanged; a prompt loaded back from the store comes with its room too."""
    from kvbench.models.session import prefill

    session = tiny_sessions("llama")
    ids = _prompt(session.tokenizer).context
    method = implementation(build_method(name, {} if name == "identity" else {"ratio": 0.5}),
                            "torch")
    recorded = prefill_plain(session, ids, queries=method.prompt_queries, room=8)
    before = [layer[0].clone() for layer in recorded.layers]
    first, later = session.new_cache(method), session.new_cache(method)
    for cache in (first, later):
        session.reserve(cache, len(ids) + 8)
        last, _, _ = prefill(session, cache, ids, method, prefilled=recorded)
        for _ in range(3):
            last = session.step([int(last[-1].argmax())], cache)[0]
    assert recorded.buffers is None  # handed over once
    for layer, policy in enumerate(first.policies):
        keys, _, _ = policy.attention_inputs()
        held = keys.untyped_storage().data_ptr()
        taken = held == recorded.layers[layer][0].untyped_storage().data_ptr()
        assert taken == (name == "identity"), layer  # snapkv keeps a compacted copy
        assert torch.equal(recorded.layers[layer][0], before[layer])
    for own, other in zip(first.policies, later.policies):
        assert all(torch.equal(a, b) for a, b in zip(own.attention_inputs()[:2],
                                                     other.attention_inputs()[:2]))
    store = PrefillStore()
    try:
        store.expect(session, [ids])
        made = store.get(session, ids, room=8)
        loaded = store.get(session, ids)
        assert store.reused == 1
        for (k, v), (k2, v2) in zip(made.buffers, loaded.buffers):
            assert k2.shape[-2] == len(ids) + 8 and torch.equal(k2[..., :len(ids), :],
                                                                k[..., :len(ids), :])
    finally:
        store.close()


def test_a_codec_that_packs_while_prefilling_shares_one_forward_only(tiny_sessions):
    """kivi, decay, adaptive read a forward's own tokens exact: one forward is the plain
    model's, but a later forward reads the earlier ones packed (kivi past its residual), so
    its own prefill in chunks is not the plain one and is never handed it."""
    from kvbench.models.session import prefill

    session = tiny_sessions("llama")
    ids = _prompt(session.tokenizer).context
    kivi = implementation(build_method("kivi", {"residual": 32, "group_size": 32}), "torch")
    for name in ("kivi", "decay", "adaptive"):
        method = kivi if name == "kivi" else implementation(build_method(name), "torch")
        assert shares_prefill(session, method, len(ids), 0), name
        assert not shares_prefill(session, method, len(ids), 40), name
    plain = prefill_plain(session, ids, chunk=40)
    cache = session.new_cache(kivi)
    last, _, _ = prefill(session, cache, ids, kivi, probe=[], chunk=40)
    assert not torch.equal(last, plain.logits)  # what sharing it would have got wrong
