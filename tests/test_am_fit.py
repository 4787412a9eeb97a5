"""Attention Matching fit math (kvbench.methods.torch.am_fit), checked against direct float64 formulas."""
import math

import pytest
import torch

from kvbench.methods.torch.am_fit import fit_beta, fit_values, key_scores, mad_mask
from kvbench.methods.torch.token_cache import top_k


def _qkv(H, n, T, d, seed):
    torch.manual_seed(seed)
    return torch.randn(H, n, d), torch.randn(H, T, d), torch.randn(H, T, d)


def _clustered(H, n, T, d, seed, clusters=6):
    """Keys in a few tight clusters and queries aimed at them: dropping keys from a cluster loses
    attention mass that a bias on the kept ones can restore, so the fit has something to do."""
    torch.manual_seed(seed)
    centers = 1.5 * torch.randn(H, clusters, d)
    which = torch.randint(clusters, (H, T))
    keys = torch.gather(centers, 1, which[..., None].expand(-1, -1, d)) + 0.3 * torch.randn(H, T, d)
    aim = torch.randint(clusters, (H, n))
    queries = torch.gather(centers, 1, aim[..., None].expand(-1, -1, d))
    queries = queries + 0.7 * torch.randn(H, n, d)
    return queries, keys, torch.randn(H, T, d)


def _attend(q, k, v, scaling, beta=None):
    logits = q.double() @ k.double().transpose(-1, -2) * scaling
    if beta is not None:
        logits = logits + beta.double()[:, None, :]
    return torch.softmax(logits, dim=-1) @ v.double()


def _gather(x, sel):
    return torch.gather(x, 1, sel[..., None].expand(-1, -1, x.shape[-1]))


def _mass_system(q, k, sel, scaling):
    logits = q.double() @ k.double().transpose(-1, -2) * scaling
    e = torch.exp(logits - logits.amax(-1, keepdim=True))
    return torch.gather(e, 2, sel[:, None, :].expand(-1, e.shape[1], -1)), e.sum(-1)


def _mass_residual(q, k, sel, scaling, beta, per_head=False):
    """||E[:, S] exp(beta) - rowsum(E)|| over all heads (or per head), written out in float64."""
    e_sel, mass = _mass_system(q, k, sel, scaling)
    r = (e_sel @ beta.double().exp()[..., None]).squeeze(-1) - mass
    return r.norm(dim=-1) if per_head else r.norm().item()


def _bounded_optimum(q, k, sel, scaling, iters=5000):
    """Reference for min ||E[:, S] B - rowsum(E)|| over B in [e^-3, e^3]: projected gradient from
    B = 1, run long, with the exact spectral norm for the step."""
    e_sel, mass = _mass_system(q, k, sel, scaling)
    step = 1.0 / torch.linalg.matrix_norm(e_sel, ord=2).square()[:, None]
    b = torch.ones(e_sel.shape[0], e_sel.shape[2], dtype=torch.float64)
    for _ in range(iters):
        grad = (e_sel.transpose(-1, -2) @ ((e_sel @ b[..., None]).squeeze(-1) - mass)[..., None])
        b = (b - step * grad.squeeze(-1)).clamp(math.exp(-3), math.exp(3))
    return _mass_residual(q, k, sel, scaling, b.log())


@pytest.mark.parametrize("how", ["rms", "max", "mean"])
def test_key_scores_match_direct_float64(how):
    q, k, _ = _qkv(3, 20, 33, 8, seed=1)
    s = 1 / math.sqrt(8)
    got = key_scores(q, k, s, how=how)
    a = torch.softmax(q.double() @ k.double().transpose(-1, -2) * s, dim=-1)
    want = {"rms": a.square().mean(1).sqrt(), "max": a.amax(1), "mean": a.mean(1)}[how]
    assert got.shape == (3, 33) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-7)


def test_key_scores_reductions_differ_and_unknown_raises():
    q, k, _ = _qkv(2, 16, 12, 8, seed=2)
    rms, mx, mean = (key_scores(q, k, 0.35, how=h) for h in ("rms", "max", "mean"))
    # mean <= rms <= max over queries, strictly for non-constant columns
    assert (mean <= rms + 1e-7).all() and (rms <= mx + 1e-7).all()
    assert (rms - mean).abs().max() > 1e-4
    with pytest.raises(ValueError, match="score reduction"):
        key_scores(q, k, 0.35, how="median")


def test_top_k_sorted_indices_of_largest():
    torch.manual_seed(3)
    scores = torch.rand(4, 50)
    sel = top_k(scores, 7)
    assert sel.shape == (4, 7) and sel.dtype == torch.long
    assert (sel[:, 1:] > sel[:, :-1]).all()
    for h in range(4):
        want = set(torch.argsort(scores[h], descending=True)[:7].tolist())
        assert set(sel[h].tolist()) == want
        # every kept score beats every dropped one
        mask = torch.zeros(50, dtype=torch.bool)
        mask[sel[h]] = True
        assert scores[h][mask].min() > scores[h][~mask].max()
    assert top_k(scores, 50).tolist() == [list(range(50))] * 4


def test_keeping_every_key_is_exact():
    H, n, T, d = 2, 64, 16, 8
    q, k, v = _qkv(H, n, T, d, seed=4)
    s = 1 / math.sqrt(d)
    sel = torch.arange(T).expand(H, -1).contiguous()
    beta = fit_beta(q, k, sel, s)
    assert beta.shape == (H, T) and beta.dtype == torch.float32
    assert beta.abs().max() < 1e-5
    c_v = fit_values(q, k, v, sel, beta, s)
    assert c_v.shape == (H, T, d) and c_v.dtype == torch.float32
    torch.testing.assert_close(c_v, v, rtol=0, atol=1e-4)
    out = _attend(q, k, c_v, s, beta)
    assert (out - _attend(q, k, v, s)).abs().max() < 1e-5


def test_beta_lowers_mass_residual_is_bounded_and_deterministic():
    H, n, T, t, d = 3, 48, 80, 12, 16
    q, k, _ = _clustered(H, n, T, d, seed=5)
    s = 1 / math.sqrt(d)
    sel = top_k(key_scores(q, k, s), t)
    beta = fit_beta(q, k, sel, s, seed=7)
    assert beta.shape == (H, t)
    assert beta.min() >= -3 - 1e-6 and beta.max() <= 3 + 1e-6
    before = _mass_residual(q, k, sel, s, torch.zeros(H, t))
    after = _mass_residual(q, k, sel, s, beta)
    assert after < 0.7 * before, (before, after)
    # the bounds bind here (unconstrained least squares wants some B < 0), yet the default few
    # steps get within a few percent of the bounded optimum
    assert after <= 1.03 * _bounded_optimum(q, k, sel, s), after
    assert torch.equal(beta, fit_beta(q, k, sel, s, seed=7))
    # Clamping the unconstrained solution can land worse than B = 1 (it does for two of these
    # heads); even with no gradient steps no head may end worse than beta = 0.
    ones = _mass_residual(q, k, sel, s, torch.zeros(H, t), per_head=True)
    for steps in (0, 20):
        fitted = _mass_residual(q, k, sel, s, fit_beta(q, k, sel, s, steps=steps), per_head=True)
        assert (fitted <= ones + 1e-9).all(), (steps, fitted, ones)


def test_beta_hits_bounds_when_mass_cannot_be_matched():
    # Keep one key of 60 identical ones: matching the mass needs B = 60 > e^3, so B clamps at e^3.
    H, n, T, d = 2, 10, 60, 4
    torch.manual_seed(6)
    q = torch.randn(H, n, d)
    k = torch.randn(H, 1, d).expand(H, T, d).contiguous()
    sel = torch.zeros(H, 1, dtype=torch.long)
    beta = fit_beta(q, k, sel, 0.5)
    torch.testing.assert_close(beta, torch.full((H, 1), 3.0))


def test_fitted_beta_and_values_beat_plain_top_t():
    H, n, T, t, d = 2, 64, 96, 24, 16
    q, k, v = _clustered(H, n, T, d, seed=8)
    s = 1 / math.sqrt(d)
    sel = top_k(key_scores(q, k, s), t)
    c_k, v_sel = _gather(k, sel), _gather(v, sel)
    truth = _attend(q, k, v, s)

    beta = fit_beta(q, k, sel, s)
    c_v = fit_values(q, k, v, sel, beta, s)

    def err(beta_, c_v_):
        return (_attend(q, c_k, c_v_, s, beta_) - truth).norm().item()

    plain = err(torch.zeros(H, t), v_sel)
    beta_only = err(beta, v_sel)
    full = err(beta, c_v)
    assert full < beta_only and full < plain, (plain, beta_only, full)
    assert full < 0.5 * plain, (plain, full)


def test_ridge_zero_is_lstsq_and_ridge_shrinks():
    H, n, T, t, d = 2, 40, 30, 10, 8
    q, k, v = _qkv(H, n, T, d, seed=9)
    s = 1 / math.sqrt(d)
    sel = top_k(key_scores(q, k, s), t)
    torch.manual_seed(10)
    beta = 0.5 * torch.randn(H, t)

    x = torch.softmax(q.double() @ _gather(k, sel).double().transpose(-1, -2) * s
                      + beta.double()[:, None, :], dim=-1)
    y = _attend(q, k, v, s)
    want = torch.stack([torch.linalg.lstsq(x[h], y[h], driver="gelsd").solution for h in range(H)])

    plain = fit_values(q, k, v, sel, beta, s, ridge=0.0)
    torch.testing.assert_close(plain.double(), want, rtol=1e-5, atol=1e-5)
    shrunk = fit_values(q, k, v, sel, beta, s, ridge=1e-2)
    more = fit_values(q, k, v, sel, beta, s, ridge=1.0)
    assert more.norm() < shrunk.norm() < plain.norm()
    # ridge is the closed form (X^T X + lambda I)^-1 X^T Y
    eye = torch.eye(t, dtype=torch.float64)
    closed = torch.linalg.solve(x.transpose(-1, -2) @ x + 1e-2 * eye, x.transpose(-1, -2) @ y)
    torch.testing.assert_close(shrunk.double(), closed, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        fit_values(q, k, v, sel, beta, s, ridge=-1.0)


def test_values_rank_deficient_give_min_norm():
    # Duplicate kept keys with equal bias give identical columns of X: least squares is
    # underdetermined; the minimum-norm answer splits the value evenly between the copies, and
    # reproduces the original attention output.
    H, n, T, d = 1, 20, 8, 4
    q, k, v = _qkv(H, n, T, d, seed=11)
    k[:, 1] = k[:, 0]
    sel = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7]])
    c_v = fit_values(q, k, v, sel, torch.zeros(1, 8), 0.5)
    assert torch.isfinite(c_v).all()
    torch.testing.assert_close(c_v[0, 0], c_v[0, 1], rtol=0, atol=1e-5)
    torch.testing.assert_close(_attend(q, k, c_v, 0.5), _attend(q, k, v, 0.5), rtol=0, atol=1e-4)


def test_mad_mask_keeps_outliers_across_heads():
    torch.manual_seed(12)
    T = 40
    base = 1.0 + 0.05 * torch.randn(3, T)
    stand_out = [4, 17, 33]
    base[:, stand_out] += 2.0
    # token 9 stands out in one head and sinks in another: only the head average counts
    base[0, 9] += 0.5
    base[1, 9] -= 0.5
    keep = mad_mask(base, tau=3.0)
    assert keep.dtype == torch.bool and keep.shape == (T,)
    assert keep.nonzero().flatten().tolist() == stand_out


def test_mad_mask_threshold_formula_and_fallback():
    scores = torch.tensor([[1.0, 2.0, 3.0, 4.0, 10.0, 11.0]])
    # median 3.5, |dev| = 2.5 1.5 .5 .5 6.5 7.5 -> MAD 2.0; tau=1 -> keep > 5.5
    assert mad_mask(scores, 1.0).tolist() == [False] * 4 + [True, True]
    # tau=0 -> keep > 3.5
    assert mad_mask(scores, 0.0).tolist() == [False] * 3 + [True] * 3
    flat = mad_mask(torch.full((2, 9), 0.25), tau=2.0)
    assert flat.sum() == 1
    # nothing passes a high threshold: the single best token survives
    assert mad_mask(scores, 100.0).nonzero().flatten().tolist() == [5]


def test_causal_positions_hide_later_keys_everywhere():
    from kvbench.methods.torch.am_fit import fit_beta, fit_values, key_scores

    H, n, T, d = 2, 24, 24, 8
    q, k, v = _qkv(H, n, T, d, seed=21)
    s = 1 / math.sqrt(d)
    positions = torch.arange(n)
    masked = (q.double() @ k.double().transpose(-1, -2) * s).masked_fill(
        torch.ones(n, T, dtype=torch.bool).triu(1), -math.inf)
    want = torch.softmax(masked, -1).square().mean(-2).sqrt()
    torch.testing.assert_close(key_scores(q, k, s, positions=positions).double(), want,
                               rtol=1e-5, atol=1e-6)
    # queries that sit after every key see them all: the same as no positions
    late = torch.full((n,), T - 1)
    torch.testing.assert_close(key_scores(q, k, s, positions=late), key_scores(q, k, s))
    sel = top_k(key_scores(q, k, s, positions=positions), 8)
    torch.testing.assert_close(fit_beta(q, k, sel, s, positions=late), fit_beta(q, k, sel, s))
    # the value fit skips queries that see no kept key, and stays finite
    beta = fit_beta(q, k, sel, s, positions=positions)
    c_v = fit_values(q, k, v, sel, beta, s, positions=positions)
    assert torch.isfinite(c_v).all() and torch.isfinite(beta).all()
    assert not torch.allclose(c_v, fit_values(q, k, v, sel, beta, s))


def test_ridge_fit_on_large_batched_systems_with_several_threads():
    """The ridge solve at the bundled model's size (3 KV heads, t = 256) with two threads, where
    torch 2.13's batched linalg.solve failed on the CPU; the normal equations hold."""
    from kvbench.methods.torch.am_fit import fit_values

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k, v = _qkv(3, 96, 1024, 16, seed=5)
        selected = torch.arange(0, 1024, 4).expand(3, -1)
        beta = torch.zeros(3, 256)
        c_v = fit_values(q, k, v, selected, beta, 0.25, ridge=1e-3).double()
    finally:
        torch.set_num_threads(threads)
    x = torch.softmax(q.double() @ k.double()[:, ::4].transpose(-1, -2) * 0.25, dim=-1)
    y = torch.softmax(q.double() @ k.double().transpose(-1, -2) * 0.25, dim=-1) @ v.double()
    residual = x.transpose(-1, -2) @ (x @ c_v - y) + 1e-3 * c_v  # gradient of the ridge loss
    assert residual.abs().max() < 1e-4


def test_segmented_fits_match_each_segment_and_stay_close_to_the_whole():
    """Fitted in segments, each segment's kept keys reproduce that segment's attention (mass and
    output) as fitting it alone does, so the compacted attention over all of them stays close to
    the truth: far better than plain top-t, within a few times the whole prompt's error (fewer
    kept keys per fit: 2.6-4.8x on seeds 0-3, 5-10x below plain top-t). A prompt within one
    segment is the whole fit, bit for bit."""
    from kvbench.methods.torch.am_fit import fit_in_segments

    H, n, T, t, d, segment = 2, 400, 512, 128, 16, 128
    q, k, v = _clustered(H, n, T, d, seed=12)
    s = 1 / math.sqrt(d)
    sel = top_k(key_scores(q, k, s), t)
    truth = _attend(q, k, v, s)
    whole_beta = fit_beta(q, k, sel, s)
    whole_v = fit_values(q, k, v, sel, whole_beta, s)
    beta, c_v = fit_in_segments(q, k, v, sel, s, T)
    assert torch.equal(beta, whole_beta) and torch.equal(c_v, whole_v)

    beta, c_v = fit_in_segments(q, k, v, sel, s, segment)
    head, first = 0, (sel[0] < segment).nonzero().squeeze(-1)
    alone = fit_beta(q[:1], k[:1, :segment], sel[:1, first], s)
    torch.testing.assert_close(beta[head, first], alone[0])
    torch.testing.assert_close(
        c_v[head, first], fit_values(q[:1], k[:1, :segment], v[:1, :segment], sel[:1, first],
                                     alone, s)[0])

    def err(beta_, c_v_):
        return (_attend(q, _gather(k, sel), c_v_, s, beta_) - truth).norm().item()

    plain, whole, segmented = err(torch.zeros(H, t), _gather(v, sel)), err(whole_beta, whole_v), \
        err(beta, c_v)
    assert segmented < 0.3 * plain and segmented < 6 * whole, (plain, whole, segmented)


def test_segmented_causal_fit_skips_queries_before_a_segment():
    """Causal: a segment is fitted on the queries that see its first key only (a query before
    it sees none of its keys: its row would be 0/0), at positions counted from the segment."""
    from kvbench.methods.torch.am_fit import fit_in_segments

    H, T, d, segment = 2, 48, 8, 16
    q, k, v = _qkv(H, T, T, d, seed=3)
    s = 1 / math.sqrt(d)
    positions = torch.arange(T)
    sel = top_k(key_scores(q, k, s, positions=positions), 20)
    beta, c_v = fit_in_segments(q, k, v, sel, s, segment, positions=positions)
    assert torch.isfinite(beta).all() and torch.isfinite(c_v).all()
    last = (sel[1] >= 2 * segment).nonzero().squeeze(-1)
    alone = fit_beta(q[1:, 2 * segment :], k[1:, 2 * segment :], sel[1:, last] - 2 * segment, s,
                     positions=positions[2 * segment :] - 2 * segment)
    torch.testing.assert_close(beta[1, last], alone[0])


def test_large_systems_are_fitted_a_head_at_a_time_with_the_batched_result(monkeypatch):
    """Past BATCHED_SYSTEM_BYTES the whole prompt's fit goes a head at a time: the same fit
    (the power iteration's start differs per head: the step size, not the optimum)."""
    from kvbench.methods.torch import am_fit

    H, n, T, t, d = 3, 64, 96, 24, 16
    q, k, v = _clustered(H, n, T, d, seed=4)
    s = 1 / math.sqrt(d)
    sel = top_k(key_scores(q, k, s), t)
    batched = am_fit.fit_in_segments(q, k, v, sel, s, T)
    monkeypatch.setattr(am_fit, "BATCHED_SYSTEM_BYTES", 0)
    fitted_heads, fit = [], am_fit._fit
    monkeypatch.setattr(am_fit, "_fit", lambda q, *a: fitted_heads.append(q.shape[0]) or fit(q, *a))
    alone = am_fit.fit_in_segments(q, k, v, sel, s, T)
    assert fitted_heads == [1] * H
    torch.testing.assert_close(alone[0], batched[0], rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(alone[1], batched[1], rtol=1e-3, atol=1e-3)
