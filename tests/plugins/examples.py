"""The example plug-in packages of docs/writing-a-method.md, installed as a user installs one."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parents[1] / "data"


def install_and_test(example: str, test_file: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Install tests/data/EXAMPLE into a folder of its own (found through its entry point) and
    run its own test file against it; a copy is built, as building leaves files beside it."""
    copy = shutil.copytree(EXAMPLES / example, tmp_path / example)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(copy)], check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(copy / test_file)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
