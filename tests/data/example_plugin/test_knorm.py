from kvbench.methods import METHODS
from kvbench.testing import check_method


def test_knorm_keeps_the_kvbench_method_contract():
    cls = METHODS.get("knorm")
    for params in cls.conformance_params:
        check_method(cls(**params))
