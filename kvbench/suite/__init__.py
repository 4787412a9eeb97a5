"""YAML suite -> validated, expanded cases."""
from kvbench.suite.case import Case, LoadedSuite
from kvbench.judge.tolerance import Tolerance
from kvbench.suite.errors import SuiteError
from kvbench.suite.loader import load_suite

__all__ = ["Case", "LoadedSuite", "SuiteError", "Tolerance", "load_suite"]
