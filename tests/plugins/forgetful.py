"""A deliberately broken method for the multiturn tests: it keeps every key and value exactly,
until a new user turn comes (a multi-token append after one-token decode appends), when it drops
everything it held before. A single-turn benchmark cannot tell it from identity; in multi-turn
every turn after the first is answered without the context. Suites name it
`tests.plugins.forgetful:Forgetful`."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.methods.core.contracts import Implementation, LayerCachePolicy
from kvbench.methods.settings import MethodSettings, implements


@dataclass
class Forgetful(MethodSettings):
    """Identity until the next user turn, which starts from an empty cache."""

    def layout(self) -> str:
        return "every token at the model's dtype until the next turn; K and V both counted"


class ForgetsEarlierTurns(LayerCachePolicy):
    """The new turn's own step already reads without the earlier tokens (a bias of -inf on
    them: the model's causal mask was sized for every key); they are dropped at the next
    append."""

    def __init__(self):
        self.keys = self.values = None
        self.seen = 0
        self.forgotten = 0  # the first tokens held, masked out until the next append drops them
        self.decoding = False  # the last append was one token (a decode step)

    def append(self, keys, values, queries=None) -> None:
        if self.forgotten:
            self.keys = self.keys[..., self.forgotten:, :]
            self.values = self.values[..., self.forgotten:, :]
            self.forgotten = 0
        tokens = keys.shape[-2]
        if tokens > 1 and self.decoding:  # a new turn after an answer: forget the conversation
            self.forgotten = self.retained_tokens
        self.decoding = tokens == 1
        self.keys = keys if self.keys is None else torch.cat([self.keys, keys], dim=-2)
        self.values = values if self.values is None else torch.cat([self.values, values], dim=-2)
        self.seen += tokens

    def attention_inputs(self):
        if not self.forgotten:
            return self.keys, self.values, None
        bias = self.keys.new_zeros(self.keys.shape[:-1])
        bias[..., : self.forgotten] = float("-inf")
        return self.keys, self.values, bias

    @property
    def seen_tokens(self) -> int:
        return self.seen

    @property
    def retained_tokens(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    @property
    def retained_bytes(self) -> int:
        return self.measured_bytes()

    def measured_bytes(self) -> int:
        if self.keys is None:
            return 0
        return self.keys.numel() * self.keys.element_size() + (
            self.values.numel() * self.values.element_size())

    def holds_exactly(self, newest: int) -> bool:
        return True


@implements(Forgetful)
class ForgetfulMethod(Implementation):
    # until a new turn it keeps every token as the model made it: its prefill is the plain one
    shares_prefill = True

    def new_layer_cache(self, layer_idx: int) -> ForgetsEarlierTurns:
        return ForgetsEarlierTurns()
