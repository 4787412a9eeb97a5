import torch

from kvbench.methods import METHODS, implementation
from kvbench.testing import check_method


def test_sinkq_keeps_the_kvbench_method_contract():
    cls = METHODS.get("sinkq")  # found through the entry point
    for params in cls.conformance_params:
        assert "codec bytes" in check_method(cls(**params))


def test_its_sinks_and_window_read_back_exact_and_the_middle_quantized():
    cache = implementation(METHODS.get("sinkq")(sinks=4, window=16)).new_layer_cache(0)
    keys, values = torch.randn(2, 1, 2, 64, 64).unbind(0)
    cache.append(keys, values)
    read_keys, read_values, _ = cache.attention_inputs()
    for read, given in ((read_keys, keys), (read_values, values)):
        exact = (read == given).all(-1)[0]  # (heads, tokens): the token read back bit-equal
        assert exact[:, :4].all() and exact[:, -16:].all() and not exact[:, 4:-16].any()


def test_its_results_name_where_it_came_from():
    from kvbench.hardware import code_provenance

    found = code_provenance(METHODS.get("sinkq"))
    assert (found["distribution"], found["version"]) == ("kvbench-sinkq", "0.1.0")
