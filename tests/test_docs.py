"""Every command the README and docs/ show, run as a reader would run it, from the repository root.

A line runs as written and must exit 0, except those listed below with how they run instead and
why: a whole suite runs with --dry-run (its suite, flags and selection are checked, nothing is
measured; its committed run is under reports/), and what installs software or rewrites committed
files is not run. A listed line the docs no longer show fails the test, so the lists cannot go
stale.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.plugins.cli_support import invoke, wait_until

ROOT = Path(__file__).parents[1]
KVBENCH = ROOT / ".venv" / "bin" / "kvbench"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

DRY_RUN = {  # a whole suite: minutes to hours
    ".venv/bin/kvbench run suites/architectures.yaml": "3.5 min; reports/architectures",
    ".venv/bin/kvbench run suites/backends.yaml --backend torch --out runs/backends-torch":
        "reports/backends/torch",
    ".venv/bin/kvbench run suites/backends.yaml --backend mlx --out runs/backends-mlx":
        "reports/backends/mlx",
    ".venv/bin/kvbench run suites/quick.yaml": "the quick suite; CI runs it gated",
    ".venv/bin/kvbench run suites/quick.yaml --baseline baselines/quick.linux-x86_64-cpu.json":
        "the quick suite gated, as .ci/run runs it",
    ".venv/bin/kvbench run suites/quick.yaml --only perplexity --methods identity,intq-bits4":
        "perplexity on the bundled model",
    ".venv/bin/kvbench run suites/quick.yaml --executor ray": "the quick suite on Ray",
    ".venv/bin/kvbench run suites/quick.yaml --executor ray --address HOST:6379":
        "HOST is the reader's cluster",
    ".venv/bin/kvbench run suites/quick.yaml --shard 1/2 --out runs/s1": "half the quick suite",
    ".venv/bin/kvbench run suites/quick.yaml --shard 2/2 --out runs/s2": "half the quick suite",
}
NOT_RUN = {
    "make demo": "runs the quick suite, which .ci/run runs gated (checked below)",
    "make test": "this test is part of it (checked below: .ci/run calls it)",
    "make site": "rewrites the committed results page; tests/test_html.py checks the page",
    '.venv/bin/pip install -e ".[ray]"': "changes the environment; make install installs the extra",
    "sudo apt-get install libopenblas0-pthread": "changes the machine",
    ".venv/bin/kvbench merge runs/s1 runs/s2 --out runs/quick":
        "joins the two dry-run shards above; the next block merges real ones",
    "python3 -m venv .venv && .venv/bin/pip install torch --index-url "
    "https://download.pytorch.org/whl/cu128": "installs a CUDA torch from the network",
    '.venv/bin/pip install -e ".[torch,cuda,datasets,serve,plots]"':
        "changes the environment; make install installs these extras",
    ".venv/bin/kvbench run ruler --model Qwen/Qwen3-8B --dtype bfloat16 --set ruler.length=16384"
    " --set ruler.samples=10 --set \"defaults.chat_template_kwargs={enable_thinking: false}\""
    " --methods identity,intq4,kivi2,snapkv-ratio0.25":
        "an 8B hub model on a GPU; tests/test_hub.py runs this command on a tiny checkpoint"
        " that a stand-in of the hub serves",
    ".venv/bin/kvbench run ruler --model Qwen/Qwen3-8B --dtype bfloat16 --set ruler.length=32768"
    " --gpus all --out runs/ruler-32k": "an 8B hub model on 8 GPUs; tests/test_local_gpus.py runs"
    " --gpus on four stated devices",
    ".venv/bin/kvbench run ruler --model Qwen/Qwen3-8B --dtype bfloat16 --set ruler.length=32768"
    " --executor ray --address HEAD:6379 --cpus-per-gpu 4 --out runs/ruler-32k":
        "HEAD is the reader's GPU cluster; tests/test_ray_gpus.py runs Ray on logical GPUs",
    ".venv/bin/kvbench run ruler --model Qwen/Qwen3-8B --dtype bfloat16 --set ruler.length=32768"
    " --shard 1/4 --gpus all --out runs/s1": "one CI job's shard on its GPUs",
    ".venv/bin/kvbench merge runs/s1 runs/s2 runs/s3 runs/s4 --out runs/ruler-32k":
        "joins the four GPU shards above",
}
SERVE = ".venv/bin/kvbench serve"  # a block that starts a server: the lines after it query it


def shown_lines(page: Path) -> list[list[str]]:
    """Each ```bash block of `page` as its command lines, comments and blank lines left out."""
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)
    return [[strip_comment(line) for line in block.splitlines()
             if strip_comment(line)] for block in blocks]


def strip_comment(line: str) -> str:
    """The command without its trailing `# ...` (a # inside quotes is kept)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1] == " "):
            return line[:i].strip()
    return line.strip()


def every_line() -> list[str]:
    return [line for page in PAGES for block in shown_lines(page) for line in block]


needs_venv = pytest.mark.skipif(not KVBENCH.exists(), reason="no .venv (make install makes it)")


def sh(command: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_lists_name_only_lines_the_docs_show():
    stale = (set(DRY_RUN) | set(NOT_RUN)) - set(every_line())
    assert stale == set()


def test_the_quickstart_is_two_commands_and_ci_runs_the_same_ones():
    (quickstart, *_) = shown_lines(ROOT / "README.md")
    assert quickstart == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\nmake test\n" in ci
    makefile = (ROOT / "Makefile").read_text()
    demo = re.search(r"^demo: install\n\t(.*)$", makefile, re.M).group(1)
    assert demo == "$(BIN)/kvbench run suites/quick.yaml"
    assert ".venv/bin/kvbench run suites/quick.yaml" in ci


def test_the_readme_is_a_sitting_and_links_pages_that_exist():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for target in re.findall(r"\]\(([^)#]+)[^)]*\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
    for page in (ROOT / "docs").glob("*.md"):
        assert f"(docs/{page.name})" in text, f"docs/{page.name} is not linked from the README"


def test_docs_link_what_exists():
    for page in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([^)#]+)[^)]*\)", page.read_text()):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.name}: {target}"


@needs_venv
def test_the_readme_tour_runs_as_written():
    (_, tour, *_) = shown_lines(ROOT / "README.md")
    for line in tour:
        done = sh(line)
        assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@needs_venv
def test_the_readme_suite_runs_and_its_claims_hold(tmp_path):
    (suite,) = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert yaml.safe_load(suite)["name"] == "mine"
    path = tmp_path / "mine.yaml"
    path.write_text(suite)
    done = sh(f"{KVBENCH} run {path} --out {tmp_path / 'out'}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"claims held (\d+)/\1\b", done.stdout)


def docs_lines() -> list[tuple[str, str]]:
    """(page, line) for every line of docs/ that runs on its own (not a server's block)."""
    lines = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for block in shown_lines(page):
            if block[0].startswith(SERVE):
                continue
            lines += [(page.name, line) for line in block]
    return lines


@needs_venv
@pytest.mark.parametrize("page, line", docs_lines(), ids=[
    f"{page}:{line[:60]}" for page, line in docs_lines()])
def test_a_docs_command_runs(page, line):
    if line in NOT_RUN:
        pytest.skip(f"not run: {NOT_RUN[line]}")
    preload = re.match(r"LD_PRELOAD=(\S+) ", line)
    if preload and not Path(preload.group(1)).exists():
        pytest.skip(f"{preload.group(1)} is not installed here")
    command = f"{line} --dry-run" if line in DRY_RUN else line
    done = sh(command)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@needs_venv
def test_the_serving_block_serves_what_it_says():
    """The server as shown, on a free port (the queries follow it there)."""
    (block,) = [block for block in shown_lines(ROOT / "docs" / "serving.md")
                if block[0].startswith(SERVE)]
    port = free_port()
    server = subprocess.Popen(["bash", "-c", f"exec {block[0]} --port {port}"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: sh(f"curl -sf localhost:{port}/health").returncode == 0, server,
                   "/health")
        outputs = []
        for line in block[1:]:
            done = sh(line.replace("localhost:8000", f"localhost:{port}"))
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
            outputs.append(done.stdout)
        assert '"choices"' in outputs[0] and "kvbench_" in outputs[1]
    finally:
        server.terminate()
        server.wait(timeout=60)


# Each generated section and the command that makes it: what the page shows is what the
# committed run holds (a table edited by hand, or a run remade without it, fails here).
SECTIONS = {
    ("README.md", "headline"): [
        "reports/quick/results.json", "--benchmark", "perplexity,niah", "--columns",
        "perplexity,ppl_rel_delta,score,kv_bytes,compression_ratio,retained_kv", "--claims"],
    ("README.md", "multiturn"): [
        "reports/multiturn/results.json", "--columns",
        "score,score_ci_low,score_ci_high,score_first,score_last,turn_slope,compression_ratio"],
    ("README.md", "stress-tasks"): [
        "reports/stress-tasks/results.json", "--columns",
        "score,score_ci_low,score_ci_high,score_vs_alone,goodput_rps,request_throughput,"
        "slo_attainment,sessions_held,answer_tokens"],
    ("reports/quick/README.md", "quick"): ["reports/quick/results.json"],
    ("docs/architectures.md", "architectures"): [
        "reports/architectures/results.json", "--grid", "parity:own_decode_max_logit_diff"],
    ("docs/architectures.md", "architectures-mlx"): [
        "reports/architectures-mlx/results.json", "--grid", "parity:own_decode_max_logit_diff"],
}


@pytest.mark.parametrize("page, section", list(SECTIONS), ids=[s for _, s in SECTIONS])
def test_a_generated_section_is_what_its_command_makes(tmp_path, page, section):
    copy = tmp_path / Path(page).name
    copy.write_text((ROOT / page).read_text())
    args = [str(ROOT / SECTIONS[page, section][0]), *SECTIONS[page, section][1:]]
    done = invoke("report", *args, "--readme", copy, "--section", section)
    assert done.exit_code == 0, done.output
    assert copy.read_text() == (ROOT / page).read_text()
    if page == "README.md":  # the README names the command that made its table
        results, *choices = SECTIONS[page, section]
        command = " ".join(["kvbench report", results, "--readme", page, "--section", section,
                            *choices])
        assert command in " ".join((ROOT / page).read_text().split())
