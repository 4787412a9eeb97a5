"""`niah`: the classic needle-in-a-haystack grid through the method's cache.

Context lengths x needle depths, one needle per cell (RULER's niah_single_2 by default: a
7-digit number keyed by a word, hidden in essay text at the cell's depth), answered greedily
through the compressed cache and scored as RULER scores it. The grid goes to results.json
(info.grid) and the report draws one heatmap per method from it.
"""
from __future__ import annotations

import statistics

from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.niah import Niah, NiahParams
from kvbench.benchmarks.measure.retrieval import (
    Reader, common_info, haystack_note, prompts_digest, score_metrics,
)
from kvbench.methods.core.contracts import Implementation

@measures(Niah)
class NiahRun(Niah):
    def run(self, params: NiahParams, method: Implementation, ctx: RunContext) -> BenchmarkOutput:
        reader = Reader.open(ctx, method, params.essay)
        samples, extras = [], []
        index = 0  # one index per needle: every cell draws its own key, value and haystack
        for length in params.lengths:
            for depth in params.depths:
                for _ in range(params.samples):
                    ctx.status(f"length {length}, depth {depth:g}%: prompt")
                    samples.append(reader.sample((params.essay,), task=params.task, index=index,
                                                 length=length, seed=params.data_seed,
                                                 essay=reader.essay, depth=float(depth)))
                    extras.append({"length": length, "depth": depth})
                    index += 1
        longest = max(params.lengths)  # sizes the prefill chunk
        records, replies = reader.answer(method, samples, params, longest, extras)
        grid = [[statistics.fmean(r["score"] for r in records
                                  if r["length"] == length and r["depth"] == depth)
                 for length in params.lengths] for depth in params.depths]
        return BenchmarkOutput(
            metrics=score_metrics([r["score"] for r in records], replies),
            info={
                "grid": {"lengths": list(params.lengths), "depths": list(params.depths),
                         "scores": grid},
                # per sample, in the order drawn: by length, then depth, then sample
                "scores": [r["score"] for r in records],
                "prompt_sha256s": [r["prompt_sha256"] for r in records],
                "predictions": [r["prediction"] for r in records],  # the gate lists flips
                "haystack": haystack_note(params.task, params.essay),
                **common_info(replies, method, params.reads,
                              reader.prefill_chunk(method, params.prefill_chunk, longest)),
            },
            comparable={"prompts_sha256": prompts_digest(records), "model": reader.session.spec,
                        "model_dtype": reader.session.dtype},
        )
