"""Running the CLI in-process for tests."""
import pytest
from click.testing import CliRunner

from kvbench import cli


@pytest.fixture(autouse=True, scope="module")
def wide_consoles():
    """rich wraps at 80 columns without a terminal; keep file:line and case ids on one line."""
    saved = [(c, c._width) for c in (cli.console, cli.err)]
    for console, _ in saved:
        console.width = 1000
    yield
    for console, width in saved:
        console._width = width


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)
