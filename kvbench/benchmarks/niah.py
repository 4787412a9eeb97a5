"""`niah`: the classic needle-in-a-haystack grid through the method's cache.

Context lengths x needle depths, one needle per cell (RULER's niah_single_2 by default: a
7-digit number keyed by a word, hidden in essay text at the cell's depth), answered greedily
through the compressed cache and scored as RULER scores it. The grid goes to results.json
(info.grid) and the report draws one heatmap per method from it.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from kvbench.benchmarks.base import BenchmarkOutput, RunContext, check_at_least, register_benchmark
from kvbench.benchmarks.retrieval import (
    Reader, RetrievalBenchmark, RetrievalParams, common_info, haystack_note, one_of,
    prompts_digest, score_metrics,
)
from kvbench.methods.base import Method
from kvbench.models.info import ModelInfo

SINGLE_NEEDLE_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3")  # take a depth


@dataclass
class NiahParams(RetrievalParams):
    """Parameters of the niah benchmark, and RetrievalParams' data_seed, compress, essay, reads.

    lengths: list[int] = [1024, 2048, 4096] — context lengths (model tokens of the whole
        prompt, tokens_to_generate included): the heatmap's columns.
    depths: list[float] = [0, 25, 50, 75, 100] — needle depths, percent of the haystack: rows.
    samples: int = 1 — needles per cell (each a fresh key, value and haystack draw).
    task: str = "niah_single_2" — the single-needle RULER task each cell is: niah_single_1
        (noise haystack), niah_single_2 (essay, number), niah_single_3 (essay, uuid).
    """

    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096])
    depths: list[float] = field(default_factory=lambda: [0.0, 25.0, 50.0, 75.0, 100.0])
    samples: int = 1
    task: str = "niah_single_2"

    def __post_init__(self):
        one_of("task", self.task, SINGLE_NEEDLE_TASKS)
        check_at_least(self, {"samples": 1})
        if not self.lengths or not self.depths:
            raise ValueError("lengths and depths need at least one value each")
        if min(self.lengths) < 256:
            raise ValueError(f"lengths must be >= 256, got {min(self.lengths)}")
        if not all(0 <= d <= 100 for d in self.depths):
            raise ValueError(f"depths are percents: 0 to 100, got {self.depths}")
        super().__post_init__()


@register_benchmark("niah")
class Niah(RetrievalBenchmark):
    """Needle-in-a-haystack grid through the cache; the haystack is pydoc text, not Paul Graham's.

    A grid of context lengths x needle depths, one needle per cell, answered through the
    method's cache; a heatmap per method in the report. Essay text is `essay` (pydoc by
    default) in place of Paul Graham's essays."""

    Params = NiahParams

    def check(self, params: NiahParams, model: ModelInfo | None) -> None:
        self.check_model(params, model, max(params.lengths))

    def run(self, params: NiahParams, method: Method, ctx: RunContext) -> BenchmarkOutput:
        reader = Reader.open(ctx, method, params.essay)
        grid = [[0.0] * len(params.lengths) for _ in params.depths]
        records, replies = [], []
        index = 0  # one index per needle: every cell draws its own key, value and haystack
        for col, length in enumerate(params.lengths):
            for row, depth in enumerate(params.depths):
                cell = []
                for _ in range(params.samples):
                    ctx.status(f"length {length}, depth {depth:g}%: prompt")
                    sample = reader.sample((params.essay,), task=params.task, index=index,
                                           length=length, seed=params.data_seed,
                                           essay=reader.essay, depth=float(depth))
                    index += 1
                    record, reply = reader.answer(method, sample, params, length=length,
                                                  depth=depth)
                    records.append(record)
                    replies.append(reply)
                    cell.append(record["score"])
                grid[row][col] = statistics.fmean(cell)
        return BenchmarkOutput(
            metrics=score_metrics([r["score"] for r in records], replies),
            info={
                "grid": {"lengths": list(params.lengths), "depths": list(params.depths),
                         "scores": grid},
                "haystack": haystack_note(params.task, params.essay),
                **common_info(replies, method, params.reads),
            },
            comparable={"prompts_sha256": prompts_digest(records), "model": reader.session.spec,
                        "model_dtype": reader.session.dtype},
        )
