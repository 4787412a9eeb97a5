"""kvpress's own pipeline on kvbench's RULER prompts, timed: what kvbench's ruler cases cost beside
the library's flow on the same work (issue 67). Run it in the kvpress environment (`make
test-kvpress` builds .venv-kvpress), on a quiet machine, one thing at a time:

    .venv-kvpress/bin/python ci/kvpress_pipeline.py --samples 16 --length 2048 \
        --press SnapKVPress --press KnormPress

Each press answers every sample through KVPressTextGenerationPipeline (the context compressed,
then the question and RULER's answer prefix, greedy, each sample's tokens_to_generate), on the
bundled model in float32 with SDPA and `--threads` torch threads. `--press none` is the plain
model. Prints the wall seconds per press and the process's resident high-water mark, and the
answers' RULER score, so that a kvbench run of suites/ruler-kvpress.yaml can be set beside it.
"""
from __future__ import annotations

import argparse
import resource
import time

import kvpress
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as transformers_logging

from kvbench.benchmarks.measure.answering import ChatFrame, frame
from kvbench.benchmarks.measure.ruler_scoring import sample_score
from kvbench.data.ruler import TASKS, make_sample
from kvbench.models.bundled import prepared_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--task", default="niah_single_1")
    parser.add_argument("--press", action="append", default=[],
                        help="a kvpress press class (repeat it), or none: the plain model")
    parser.add_argument("--ratio", type=float, default=0.5, help="compression_ratio")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers_logging.disable_progress_bar()

    folder = prepared_dir("smollm2-135m", print)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    chat = ChatFrame.of(tokenizer)

    def count(sample) -> int:
        return len(frame(tokenizer, chat, sample.context, sample.question,
                         sample.answer_prefix).ids)

    samples = [make_sample(args.task, index, length=args.length, count_tokens=count,
                           seed=args.seed) for index in range(args.samples)]
    pipe = kvpress.KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)
    for name in args.press or ["none"]:
        press = (None if name == "none"
                 else getattr(kvpress, name)(compression_ratio=args.ratio))
        start, scores = time.perf_counter(), []
        for sample in samples:
            with torch.inference_mode():
                answer = pipe(sample.context, question=sample.question,
                              answer_prefix=sample.answer_prefix, press=press,
                              max_new_tokens=sample.tokens_to_generate)["answer"]
            scores.append(sample_score(answer, sample.references, TASKS[args.task].metric))
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{name}: {seconds:.1f} s for {len(samples)} samples"
              f" ({seconds / len(samples):.2f} s a sample), score {sum(scores) / len(scores):.1f},"
              f" resident high-water {peak:.0f} MB", flush=True)


if __name__ == "__main__":
    main()
