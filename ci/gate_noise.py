"""Does the gate hold on a busy machine, and does it still catch a real slowdown?

1. Noise: the suite is gated against its baseline `--runs` times while a CPU hog (one busy
   process per core) is started and stopped at random (on and off 3-15 s at a time, seeded).
   Every run must show no regression.
2. A real slowdown: `--slow-runs` times, the suite's proofs cases run with intq's encode doing
   its work twice (the code slower, the cases' definition unchanged), under the same hog. Every
   run must flag encode_vs_memcpy of every intq case.

    .venv/bin/python ci/gate_noise.py                      # 10 + 3 runs of the quick suite
    .venv/bin/python ci/gate_noise.py --runs 2 --slow-runs 1

Writes summary.json and each run's folder under --out; exits 0 when both hold.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLOW_CHILD = "_run_with_slow_intq"


def _spin() -> None:
    while True:
        pass


class Hog:
    """One busy process per core, switched on and off at random until stopped."""

    def __init__(self, seed: int, on_s=(3.0, 15.0), off_s=(3.0, 15.0)):
        self.random, self.on_s, self.off_s = random.Random(seed), on_s, off_s
        self.stopping = threading.Event()
        self.busy_s = 0.0  # time with the hog on, so far
        self.thread = threading.Thread(target=self._toggle, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.thread.join()

    def _toggle(self) -> None:
        while not self.stopping.is_set():
            spinners = [multiprocessing.Process(target=_spin, daemon=True)
                        for _ in range(os.cpu_count() or 1)]
            for p in spinners:
                p.start()
            started = time.monotonic()
            self.stopping.wait(self.random.uniform(*self.on_s))
            for p in spinners:
                p.terminate()
            for p in spinners:
                p.join()
            self.busy_s += time.monotonic() - started
            self.stopping.wait(self.random.uniform(*self.off_s))


def _gate(out: Path, baseline: Path, filtered: bool):
    from kvbench.judge.gate import gate
    from kvbench.results import load_results

    return gate(load_results(out / "results.json"), load_results(baseline),
                expect_all=not filtered)


def _run(args: list[str], out: Path, hog: Hog, slow: bool) -> dict:
    kvbench = [sys.executable, "-m", "kvbench.cli"]
    command = ([sys.executable, __file__, SLOW_CHILD] if slow else kvbench) + args
    busy_before, clock = hog.busy_s, time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "console.txt", "w") as log:
        code = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    return {"exit": code, "seconds": round(time.monotonic() - clock, 1),
            "hog_on_s_at_least": round(hog.busy_s - busy_before, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="suites/quick.yaml")
    parser.add_argument("--baseline", default="baselines/quick.linux-x86_64-cpu.json")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--slow-runs", type=int, default=3)
    parser.add_argument("--out", default="runs/gate-noise")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    out, baseline = Path(options.out), Path(options.baseline)
    summary: dict = {"noise": [], "slow": []}
    with Hog(options.seed) as hog:
        for i in range(options.runs):
            folder = out / f"noise-{i}"
            row = _run(["run", options.suite, "--out", str(folder), "--baseline", str(baseline)],
                       folder, hog, slow=False)
            report = _gate(folder, baseline, filtered=False)
            row["regressions"] = [f"{r.case_id} {r.metric}: {r.baseline:.4g} -> {r.current:.4g}"
                                  f" ({r.rule})" for r in report.regressions]
            summary["noise"].append(row)
            print(f"noise run {i}: exit {row['exit']}, {len(row['regressions'])} regression(s), "
                  f"{row['seconds']} s, hog on >= {row['hog_on_s_at_least']} s", flush=True)
        for i in range(options.slow_runs):
            folder = out / f"slow-{i}"
            row = _run(["run", options.suite, "--only", "proofs/intq*", "--out", str(folder),
                        "--baseline", str(baseline)], folder, hog, slow=True)
            rows = [r for r in _gate(folder, baseline, filtered=True).rows
                    if r.metric == "encode_vs_memcpy" and r.current is not None]  # these ran
            row["flagged"] = sorted(r.case_id for r in rows if r.verdict == "regression")
            row["missed"] = {r.case_id: f"{r.verdict}: {r.rule}" for r in rows
                             if r.verdict != "regression"}
            row["current_vs_baseline"] = {r.case_id: round(r.ratio, 3) for r in rows}
            summary["slow"].append(row)
            print(f"slow run {i}: exit {row['exit']}, encode_vs_memcpy flagged in "
                  f"{len(row['flagged'])}/{len(rows)} intq cases, {row['seconds']} s", flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    false_alarms = sum(bool(r["regressions"]) or r["exit"] != 0 for r in summary["noise"])
    missed = sum(bool(r["missed"]) or r["exit"] != 1 for r in summary["slow"])
    print(f"noise: {false_alarms} of {options.runs} runs with a regression (want 0); slowdown: "
          f"{missed} of {options.slow_runs} runs missed a case (want 0). {out / 'summary.json'}")
    return 0 if false_alarms == missed == 0 else 1


def run_with_slow_intq(args: list[str]) -> None:
    """kvbench's CLI with intq's encode doing its work twice: a real 2x slower codec."""
    from kvbench.cli import main as kvbench_main
    from kvbench.methods.intq import IntQCodec

    encode = IntQCodec.encode
    IntQCodec.encode = lambda self, x: (encode(self, x), encode(self, x))[1]
    kvbench_main(args)


if __name__ == "__main__":
    if sys.argv[1:2] == [SLOW_CHILD]:
        run_with_slow_intq(sys.argv[2:])
    else:
        sys.exit(main())
