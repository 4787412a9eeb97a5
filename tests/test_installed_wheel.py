"""kvbench as a user installs it: the wheel built from this checkout, installed into a fresh
virtual environment and run from a folder outside the checkout, holds the shipped suites and
runs them by name (`kvbench validate quick`, `kvbench list suites`).

The fresh environment sees the test interpreter's site-packages through a path file, for
kvbench's dependencies; a path file does not run the editable install's finder found there,
so `import kvbench` can only find the wheel's copy (checked)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench.suite.loader import load_suite
from tests.plugins.extras import needs
from tests.plugins.suites import ROOT
from tests.plugins.waits import HANG_S

# What the wheel is built from: the project file, the package (kvbench/suites links to
# suites/, copied as a link) and the suites.
SOURCES = ("pyproject.toml", "README.md", "kvbench", "suites")


def _run(args: list, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COLUMNS")}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=HANG_S)


def _checked(args: list, cwd: Path) -> str:
    done = _run(args, cwd)
    assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the fresh environment's bin folder, a working folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy: the build's own build/ and egg-info stay out of the repo
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, source / name)
    _checked([sys.executable, "-m", "pip", "wheel", source, "--no-deps", "--no-build-isolation",
              "--no-index", "-q", "-w", tmp / "dist"], tmp)
    [wheel] = (tmp / "dist").glob("kvbench-*.whl")

    venv = tmp / "venv"
    _checked([sys.executable, "-m", "venv", "--without-pip", venv], tmp)
    python = venv / "bin" / "python"
    site = Path(_checked([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         tmp).strip())
    ours = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    (site / "kvbench_dependencies.pth").write_text("\n".join(ours) + "\n")
    # --ignore-installed: the checkout's editable kvbench, seen through the path file, is
    # neither taken as this install nor uninstalled
    _checked([python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed",
              "--disable-pip-version-check", "-q", wheel], tmp)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return venv / "bin", elsewhere


def test_the_installed_package_is_the_wheel_with_its_suites(installed):
    bin_dir, cwd = installed
    where = _checked([bin_dir / "python", "-c",
                      "import kvbench; from kvbench.suite.locate import shipped_folder; "
                      "print(kvbench.__file__); print(shipped_folder())"], cwd).split()
    venv = bin_dir.parent.resolve()
    for path in map(Path, where):
        assert path.resolve().is_relative_to(venv), where  # not the checkout's
    assert (Path(where[1]) / "quick.yaml").is_file()


def test_validate_runs_a_shipped_suite_by_name(installed):
    bin_dir, cwd = installed
    count = len(load_suite(ROOT / "suites" / "quick.yaml").cases)
    assert f"valid: quick: {count} case(s)" in _checked([bin_dir / "kvbench", "validate", "quick"],
                                                          cwd)
    # its include (cuda-e2e.yaml) is read from beside it, inside the package
    assert "valid: cuda-e2e-bf16:" in _checked([bin_dir / "kvbench", "validate", "cuda-e2e-bf16"],
                                                cwd)


@needs("datasets")
def test_a_shipped_suite_reads_its_data_from_inside_the_package(installed):
    """suites/dataset.yaml's JSONL (suites/data/) is package data beside it."""
    bin_dir, cwd = installed
    count = len(load_suite(ROOT / "suites" / "dataset.yaml").cases)
    assert f"valid: dataset: {count} case(s)" in _checked(
        [bin_dir / "kvbench", "validate", "dataset"], cwd)


def test_the_checkouts_path_says_to_use_the_name(installed):
    bin_dir, cwd = installed
    done = _run([bin_dir / "kvbench", "validate", "suites/quick.yaml"], cwd)
    assert done.returncode == 2
    assert "kvbench ships a suite of that name: `quick`" in done.stderr


def test_list_suites_names_every_shipped_suite(installed):
    bin_dir, cwd = installed
    listed = _checked([bin_dir / "kvbench", "list", "suites"], cwd)
    rows = {line.strip("│ ").split(" ")[0] for line in listed.splitlines()}
    suites = ROOT / "suites"
    names = {p.relative_to(suites).with_suffix("").as_posix() for p in suites.rglob("*.yaml")}
    assert names <= rows
