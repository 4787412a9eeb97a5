"""The math of Attention Matching (AM) KV-cache compaction (Zweiger et al. 2026), in pure torch.

Per layer and KV head, with keys K and values V (T x d, post-RoPE), reference queries Q (n x d),
the attention scale s (usually 1/sqrt(d)) and a budget t:

1. Score each key by how much attention the reference queries give it: A = softmax(s Q K^T)
   (float32) and score_j = sqrt(mean_i A_ij^2) ('rms'), or max_i / mean_i A_ij.
2. Keep the top-t keys, C_k = K[S], at their original positions (S sorted ascending).
3. Fit one log-bias per kept key so each query's total attention mass survives the cut: with
   E = exp(s Q K^T - rowmax), solve min_B ||E[:, S] B - rowsum(E)||^2 over B in [e^-3, e^3]
   (least squares, clamp, then projected-gradient steps with step 1/L, L = sigma_max(E[:, S])^2
   from a seeded power iteration), and beta = log B.
4. Fit the kept values so the compacted attention reproduces the original output:
   X = softmax(s Q C_k^T + beta), Y = softmax(s Q K^T) V, C_v = argmin ||X C_v - Y||^2
   + ridge ||C_v||^2. ridge = 0 is the original AM (plain least squares, minimum-norm when X is
   rank deficient).

The task-guided variant shares one token mask across a layer's heads: per-head scores are
averaged over heads and tokens scoring above median + tau * MAD are kept (`mad_mask`).

All functions are batched over H KV heads: queries (H, n, d), keys and values (H, T, d),
selected indices (H, t). Scores are taken in float32 and the fits in float64; results are float32.

`positions` (n,), when given, makes every step causal: query i sees only keys at positions
<= positions[i] (keys sit at 0 .. T-1), in A, E, Y and X alike, and a query that sees no kept key
drops out of the value fit. Without it (the spec) every query sees every key: right for queries
from after the context (a task prompt, a repeat of the context), while the context's own queries
then meet keys at negative RoPE distances they never saw in the model.

Blocks of queries: scores and fits take the reference queries in blocks whose (H, rows, T)
logits fit in `block_bytes` (default: token_cache.query_block_rows's, at most a quarter of the
keys in float32 or 16 MiB), so a long prompt's step holds one block, not queries x keys (n =
groups x prompt for `am`). Where all the queries fit in one block, each is the unblocked
computation, bit for bit. In blocks the scores sum over queries in another order; the
least-squares fits take the R factor of their stacked rows block by block (QR of the previous R
stacked on the next rows: the same R up to row signs, hence the same minimum-norm solution),
and their Gram matrices from it. The fit's own t x t system (t kept keys per head) is not
blocked: fit_in_segments bounds t by fitting a long prompt segment by segment.
"""
from __future__ import annotations

import math

import torch

from kvbench.methods.torch.token_cache import query_block_rows

BETA_BOUND = 3.0  # B = exp(beta) is kept in [e^-3, e^3]
# Fits whose heads' t x t float64 systems take more than this together go a head at a time (a
# few such matrices are held at once: 67 MB each for 8 heads at t = 1024)
BATCHED_SYSTEM_BYTES = 16 * 2**20
_POWER_ITERS = 30
_HOWS = ("rms", "max", "mean")


def _check_heads(queries: torch.Tensor, keys: torch.Tensor) -> None:
    if queries.ndim != 3 or keys.ndim != 3:
        raise ValueError(f"queries and keys must be (H, n, d) and (H, T, d); got "
                         f"{tuple(queries.shape)} and {tuple(keys.shape)}")
    if queries.shape[0] != keys.shape[0] or queries.shape[-1] != keys.shape[-1]:
        raise ValueError(f"queries {tuple(queries.shape)} and keys {tuple(keys.shape)} disagree "
                         "on heads or head dim")


def _check_selected(selected: torch.Tensor, keys: torch.Tensor) -> None:
    if selected.ndim != 2 or selected.shape[0] != keys.shape[0]:
        raise ValueError(f"selected must be (H, t) with H = {keys.shape[0]}; "
                         f"got {tuple(selected.shape)}")


def _gather_rows(x: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """x (H, T, d), selected (H, t) -> (H, t, d)."""
    return torch.gather(x, 1, selected.to(x.device)[..., None].expand(-1, -1, x.shape[-1]))


def _lstsq(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Minimum-norm least squares, batched; a (H, m, k), b (H, m, r) -> (H, k, r).

    A tall a (many reference queries, fewer kept keys) is first reduced to its R factor:
    a = QR with Q's columns orthonormal, so ||a x - b|| and ||R x - Q^T b|| differ by a constant
    and have the same minimum-norm minimiser, which the SVD-based solver then finds on a k x k
    problem (6x faster at 3 x 3072 x 512 here; rank-revealing QR, gelsy, was faster still but
    returned wrong solutions on rank-deficient inputs). gelsd exists only on CPU; CUDA's lstsq
    has only 'gels', which assumes full rank, so there the pseudo-inverse stands in."""
    if a.shape[-2] > a.shape[-1]:
        q, r = torch.linalg.qr(a)
        a, b = r, q.transpose(-1, -2) @ b
    if a.device.type == "cpu":
        return torch.linalg.lstsq(a, b, driver="gelsd").solution
    return torch.linalg.pinv(a) @ b


def _r_factor(pieces, width: int) -> torch.Tensor:
    """R (H, min(n, width), width) of the n rows (H, rows, width) that `pieces` yields, stacked:
    each panel of at least `width` rows is folded in by a QR of the R so far stacked on it
    (the R of the stack is the R of all the rows, up to the signs of its rows), so what is held
    is R and one panel, never the n rows."""
    r, panel, count = None, [], 0
    for piece in pieces:
        panel.append(piece)
        count += piece.shape[-2]
        if count >= width:
            r, panel, count = _fold(r, panel), [], 0
    return _fold(r, panel) if panel else r


def _fold(r: torch.Tensor | None, panel: list[torch.Tensor]) -> torch.Tensor:
    return torch.linalg.qr(torch.cat(([] if r is None else [r]) + panel, dim=-2), mode="r")[1]


def _row_blocks(n: int, rows: int, queries: torch.Tensor, positions: torch.Tensor | None):
    """(queries, positions) of each block of `rows` reference queries, in order."""
    for start in range(0, n, rows):
        yield (queries[:, start : start + rows],
               None if positions is None else positions[start : start + rows])


def _logits(queries: torch.Tensor, keys: torch.Tensor, scaling: float,
            positions: torch.Tensor | None, key_positions: torch.Tensor | None = None
            ) -> torch.Tensor:
    """scaling * Q K^T (H, n, T) at the queries' dtype, -inf where a query may not see a key
    (positions given: key position > the query's); key_positions (H, T) default to 0 .. T-1."""
    logits = (queries @ keys.transpose(-1, -2)).mul_(scaling)  # in place: one block held
    if positions is None:
        return logits
    if key_positions is None:
        key_positions = torch.arange(keys.shape[-2], device=keys.device).expand(keys.shape[0], -1)
    hidden = key_positions[:, None, :] > positions.to(keys.device)[None, :, None]
    return logits.masked_fill_(hidden, -math.inf)


def key_scores(queries: torch.Tensor, keys: torch.Tensor, scaling: float,
               how: str = "rms", positions: torch.Tensor | None = None,
               block_bytes: int | None = None) -> torch.Tensor:
    """Per-key attention score (H, T), float32: the attention A = softmax(scaling * Q K^T) that the
    n reference queries give each key, reduced over queries by `how`: 'rms' sqrt(mean A^2),
    'max' or 'mean'. In blocks of queries (module docstring): 'max' is exact, 'rms' and 'mean'
    sum over queries in another order (float32 rounding)."""
    if how not in _HOWS:
        raise ValueError(f"unknown score reduction {how!r}; expected one of {_HOWS}")
    _check_heads(queries, keys)
    heads, n = queries.shape[:2]
    total = keys.shape[-2]
    rows = query_block_rows(n, heads * total * 4, keys.device, block_bytes, keys.numel() * 4)
    q, k = queries.float(), keys.float()
    if rows >= n:
        attn = torch.softmax(_logits(q, k, scaling, positions), dim=-1)
        if how == "rms":
            return attn.square().mean(dim=-2).sqrt()
        if how == "max":
            return attn.amax(dim=-2)
        return attn.mean(dim=-2)
    reduced = torch.zeros(heads, total, dtype=torch.float32, device=keys.device)
    for block, where in _row_blocks(n, rows, q, positions):
        attn = torch.softmax(_logits(block, k, scaling, where), dim=-1)
        if how == "max":
            torch.maximum(reduced, attn.amax(dim=-2), out=reduced)
        else:
            reduced += (attn.square_() if how == "rms" else attn).sum(dim=-2)
    if how == "max":
        return reduced
    reduced /= n
    return reduced.sqrt_() if how == "rms" else reduced


def mad_mask(scores: torch.Tensor, tau: float) -> torch.Tensor:
    """One token mask (T,) shared by all heads (the task-guided variant).

    `scores` (H, T) (or (T,) for a single head) are averaged over heads; a token is kept when its
    aggregate exceeds median + tau * MAD, MAD being the median absolute deviation from the median
    (medians of an even count average the two middle values). When no token passes, e.g. all
    scores are equal, the single best token (the first, on ties) is kept so the cache is never
    empty."""
    agg = scores.double().reshape(-1, scores.shape[-1]).mean(dim=0)
    med = torch.quantile(agg, 0.5)
    mad = torch.quantile((agg - med).abs(), 0.5)
    keep = agg > med + tau * mad
    if not keep.any():
        keep[torch.argmax(agg)] = True
    return keep


def _mass_system(queries: torch.Tensor, keys: torch.Tensor, selected: torch.Tensor,
                 scaling: float, positions: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """M = E[:, S] (H, n, t) and m = rowsum(E) (H, n), float64, E = exp(scaling Q K^T - rowmax).
    Subtracting the row max keeps E in (0, 1] with a 1 in each row, whatever the logit range."""
    e = _logits(queries.double(), keys.double(), scaling, positions)
    e = e.sub_(e.amax(dim=-1, keepdim=True)).exp_()
    idx = selected.to(e.device)[:, None, :].expand(-1, e.shape[1], -1)
    return torch.gather(e, 2, idx), e.sum(-1)


def _residual(m_sel: torch.Tensor, b: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Squared mass-matching residual per head, ||M b - m||^2 -> (H,)."""
    return ((m_sel @ b[..., None]).squeeze(-1) - mass).square().sum(-1)


def fit_beta(queries: torch.Tensor, keys: torch.Tensor, selected: torch.Tensor, scaling: float,
             steps: int = 20, seed: int = 0, positions: torch.Tensor | None = None,
             block_bytes: int | None = None) -> torch.Tensor:
    """Log-biases beta (H, t), float32, for the kept keys `selected` (H, t): beta = log B with
    B in [e^-3, e^3] minimising ||E[:, S] B - rowsum(E)||^2 (see the module docstring).

    B starts from the clamped least-squares solution, or from all ones (beta = 0) for a head where
    that matches the mass better (clamping a wild unconstrained solution can land far off), then
    takes `steps` projected-gradient steps of size 1/L; a head whose steps did not lower the
    residual keeps its start. So the residual never exceeds that of beta = 0. L comes from a power
    iteration on E[:, S]^T E[:, S] started from a vector drawn from torch.Generator seeded with
    `seed`, so the result is deterministic given the seed.

    In blocks of queries, [E[:, S] | rowsum(E)] is held as its R factor [[R, c], [0, rho]]
    (module docstring): the least squares is solved on (R, c), the gradient's Gram matrix and
    right-hand side are R^T R and R^T c, and a residual ||E[:, S] B - m|| is ||R B - c, rho||,
    the same in exact arithmetic."""
    _check_heads(queries, keys)
    _check_selected(selected, keys)
    lo, hi = math.exp(-BETA_BOUND), math.exp(BETA_BOUND)
    (H, n, _), (T, t) = queries.shape, (keys.shape[-2], selected.shape[-1])
    rows = query_block_rows(n, H * T * 8, keys.device, block_bytes, keys.numel() * 4)
    if rows >= n:
        m_sel, mass = _mass_system(queries, keys, selected, scaling, positions)
        b_ls = _lstsq(m_sel, mass[..., None]).squeeze(-1)
        gram = m_sel.transpose(-1, -2) @ m_sel  # (H, t, t): gradient is gram @ B - rhs
        rhs = (m_sel.transpose(-1, -2) @ mass[..., None]).squeeze(-1)

        def residual(b: torch.Tensor) -> torch.Tensor:
            return _residual(m_sel, b, mass)
    else:
        r = _r_factor((torch.cat([m_sel, mass[..., None]], dim=-1) for m_sel, mass in (
            _mass_system(block, keys, selected, scaling, where)
            for block, where in _row_blocks(n, rows, queries, positions))), t + 1)
        r_sel, c = r[:, :t, :t], r[:, :t, t]
        b_ls = _lstsq(r_sel, c[..., None]).squeeze(-1)
        gram = r_sel.transpose(-1, -2) @ r_sel
        rhs = (r_sel.transpose(-1, -2) @ c[..., None]).squeeze(-1)

        def residual(b: torch.Tensor) -> torch.Tensor:
            return _residual(r[..., :t], b, r[..., t])

    b_ls = b_ls.clamp(lo, hi)
    ones = torch.ones_like(b_ls)
    use_ls = residual(b_ls) < residual(ones)
    start = torch.where(use_ls[:, None], b_ls, ones)

    gen = torch.Generator().manual_seed(seed)
    # M >= 0, so gram's top eigenvector is nonnegative: a positive start cannot be orthogonal to it.
    v = torch.rand(H, t, generator=gen, dtype=torch.float64, device="cpu").add_(0.5).to(gram.device)
    for _ in range(_POWER_ITERS):
        v = (gram @ v[..., None]).squeeze(-1)
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    lip = (v * (gram @ v[..., None]).squeeze(-1)).sum(-1)  # Rayleigh quotient ~ sigma_max^2
    step = torch.where(lip > 0, 1.0 / lip.clamp_min(1e-300), torch.zeros_like(lip))

    b = start
    for _ in range(steps):
        grad = (gram @ b[..., None]).squeeze(-1) - rhs
        b = (b - step[:, None] * grad).clamp(lo, hi)
    better = residual(b) <= residual(start)
    b = torch.where(better[:, None], b, start)
    return torch.log(b).float()


def fit_values(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               selected: torch.Tensor, beta: torch.Tensor, scaling: float,
               ridge: float = 0.0, positions: torch.Tensor | None = None,
               block_bytes: int | None = None) -> torch.Tensor:
    """Compacted values C_v (H, t, d), float32, so that softmax(scaling Q C_k^T + beta) C_v matches
    the original output softmax(scaling Q K^T) V on the reference queries, C_k = keys[selected].

    ridge = 0: minimum-norm least squares (the original AM). ridge > 0: (X^T X + ridge I)^-1 X^T Y,
    which shrinks C_v where X is ill conditioned. In blocks of queries, X^T X and X^T Y are
    summed block by block, and the least squares is solved on the R factor of [X | Y]."""
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0; got {ridge}")
    _check_heads(queries, keys)
    _check_selected(selected, keys)
    if values.shape[:2] != keys.shape[:2]:
        raise ValueError(f"values {tuple(values.shape)} and keys {tuple(keys.shape)} disagree")
    if beta.shape != selected.shape:
        raise ValueError(f"beta {tuple(beta.shape)} must match selected {tuple(selected.shape)}")
    q, k, v = queries.double(), keys.double(), values.double()
    c_k = _gather_rows(k, selected)
    bias = beta.double().to(q.device)[:, None, :]

    def fit_rows(block: torch.Tensor, where: torch.Tensor | None):
        """X (H, rows, t) and Y (H, rows, dv) of a block of queries."""
        y = torch.softmax(_logits(block, k, scaling, where), dim=-1) @ v
        x_logits = _logits(block, c_k, scaling, where, key_positions=selected)
        x = torch.softmax(x_logits + bias, dim=-1)
        if where is not None:  # a query that sees no kept key tells nothing: zero rows drop out
            blind = torch.isinf(x_logits).all(dim=-1, keepdim=True)
            x, y = x.masked_fill(blind, 0.0), y.masked_fill(blind, 0.0)
        return x, y

    (H, n, _), t = q.shape, selected.shape[-1]
    rows = query_block_rows(n, H * k.shape[-2] * 8, keys.device, block_bytes,
                            k.numel() * 4)
    blocks = (fit_rows(block, where) for block, where in _row_blocks(n, rows, q, positions))
    if ridge == 0:
        if rows >= n:
            return _lstsq(*next(blocks)).float()
        r = _r_factor((torch.cat(xy, dim=-1) for xy in blocks), t + v.shape[-1])
        return _lstsq(r[:, :t, :t], r[:, :t, t:]).float()
    gram = xty = None
    for x, y in blocks:
        xx, xy = x.transpose(-1, -2) @ x, x.transpose(-1, -2) @ y
        gram, xty = (xx, xy) if gram is None else (gram + xx, xty + xy)
    gram = gram + ridge * torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    # positive definite: Cholesky. (torch 2.13's batched linalg.solve on CPU fails with two or
    # more threads once the matrices reach ~256 rows: "Pivots given to lu_solve ...", MKL)
    return torch.cholesky_solve(xty, torch.linalg.cholesky(gram)).float()


def fit_in_segments(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    selected: torch.Tensor, scaling: float, segment: int, beta: bool = True,
                    fit_kept_values: bool = True, ridge: float = 0.0, seed: int = 0,
                    positions: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(beta (H, t), fitted values (H, t, dv) or None), the fits of fit_beta and fit_values (each
    only where asked; beta 0 where not), over the keys in segments of `segment` (0: one).

    A prompt of at most `segment` keys is fitted whole, batched over heads where their t x t
    systems take at most BATCHED_SYSTEM_BYTES together, else a head at a time. A longer one is
    fitted per head and per segment of keys, on the kept keys inside it (the selection stays
    global), as the paper's code compacts a long context chunk by chunk
    (compaction/compaction_methods/chunked.py, 4096 tokens): matching each segment's attention
    mass and its own output reproduces the whole softmax, since the whole is the segments'
    outputs weighted by their masses. So the fits' t x t systems are at most segment x segment
    and their time grows with the keys, not with the kept keys' square. Causal: a segment is
    fitted on the queries that see its first key, at positions counted from it."""
    heads, t = selected.shape
    if not segment or keys.shape[-2] <= segment:
        if heads * (t + 1) ** 2 * 8 <= BATCHED_SYSTEM_BYTES:
            return _fit(queries, keys, values, selected, scaling, beta, fit_kept_values, ridge,
                        seed, positions)
        segment = keys.shape[-2]  # one segment, a head at a time
    betas = torch.zeros(heads, t, dtype=torch.float32, device=keys.device)
    fitted = _gather_rows(values, selected).float() if fit_kept_values else None
    for head in range(heads):
        for start in range(0, keys.shape[-2], segment):
            stop = min(start + segment, keys.shape[-2])
            inside = ((selected[head] >= start) & (selected[head] < stop)).nonzero().squeeze(-1)
            q, where = queries[head : head + 1], positions
            if where is not None:
                sees = where >= start
                q, where = q[:, sees], where[sees] - start
            if not inside.numel() or not q.shape[-2]:
                continue  # nothing kept here, or no query sees it: beta 0, values as they were
            b, v = _fit(q, keys[head : head + 1, start:stop], values[head : head + 1, start:stop],
                        selected[head : head + 1, inside] - start, scaling, beta,
                        fit_kept_values, ridge, seed, where)
            betas[head, inside] = b[0]
            if v is not None:
                fitted[head, inside] = v[0]
    return betas, fitted


def _fit(queries, keys, values, selected, scaling, beta, fit_kept_values, ridge, seed,
         positions) -> tuple[torch.Tensor, torch.Tensor | None]:
    b = (fit_beta(queries, keys, selected, scaling, seed=seed, positions=positions) if beta
         else keys.new_zeros(selected.shape, dtype=torch.float32))
    if not fit_kept_values:
        return b, None
    return b, fit_values(queries, keys, values, selected, b, scaling, ridge=ridge,
                         positions=positions)
