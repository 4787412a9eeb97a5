"""KL divergence between the distributions that two sets of logits give, the one formula the
benchmarks share (proofs: attention rows; parity and quality: next-token distributions)."""
from __future__ import annotations

import torch


def kl_divergence(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """KL(softmax(logits_p) || softmax(logits_q)) over the last dimension, in nats, float64, one
    value per row. A -inf logit (a masked key) in p contributes nothing; where p has mass that q
    gives none, the row's KL is inf."""
    log_p = logits_p.double().log_softmax(-1)
    log_q = logits_q.double().log_softmax(-1)
    p = log_p.exp()
    # p == 0 rather than nan_to_num: 0 * (-inf - -inf) is 0 here, a NaN input still shows.
    terms = torch.where(p == 0, torch.zeros((), dtype=p.dtype, device=p.device),
                        p * (log_p - log_q))
    return terms.sum(-1)
