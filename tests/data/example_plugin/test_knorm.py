import pytest

from kvbench.config.fields import SettingError
from kvbench.methods import METHODS
from kvbench.testing import check_method


def test_knorm_keeps_the_kvbench_method_contract():
    cls = METHODS.get("knorm")  # found through the entry point
    for params in cls.conformance_params:
        assert "bytes and tokens" in check_method(cls(**params))


def test_knorm_refuses_a_budget_its_first_tokens_fill():
    with pytest.raises(SettingError, match="keep_first 9 leaves nothing"):
        METHODS.get("knorm")(budget=9, keep_first=9)


def test_its_results_name_where_it_came_from():
    from kvbench.hardware import code_provenance

    found = code_provenance(METHODS.get("knorm"))
    assert (found["distribution"], found["version"]) == ("kvbench-knorm", "0.1.0")
