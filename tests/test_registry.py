"""Method lookup: registered names, `module:Class` paths, entry points, did-you-mean."""
from dataclasses import dataclass
from importlib.metadata import EntryPoint

import pytest

from kvbench.config import registry as registry_module
from kvbench.config.registry import Registry, UnknownName
from kvbench.methods.settings.base import MethodSettings


@dataclass
class PluginMethod(MethodSettings):
    """A method (its settings) that lives outside kvbench."""


def test_registered_name_and_did_you_mean():
    reg = Registry("method")
    reg.register("lloydmax")(PluginMethod)
    assert reg.get("lloydmax") is PluginMethod and reg.names() == ["lloydmax"]
    with pytest.raises(UnknownName, match=r"Did you mean 'lloydmax'\?"):
        reg.get("lloydmx")


def test_module_class_path():
    cls = Registry("method").get(f"{__name__}:PluginMethod")
    assert cls is PluginMethod
    with pytest.raises(UnknownName, match="cannot import"):
        Registry("method").get(f"{__name__}:NoSuchClass")


def test_entry_points_are_found(monkeypatch):
    ep = EntryPoint(name="plugin", value=f"{__name__}:PluginMethod", group="kvbench.methods")
    monkeypatch.setattr(
        registry_module, "entry_points", lambda group: [ep] if group == "kvbench.methods" else []
    )
    reg = Registry("method", entry_point_group="kvbench.methods")
    assert reg.names() == ["plugin"] and reg.get("plugin") is PluginMethod


def test_a_name_registered_twice_is_refused():
    reg = Registry("method")
    reg.register("x")(PluginMethod)

    class Other(PluginMethod):
        pass

    with pytest.raises(ValueError, match="registered twice"):
        reg.register("x")(Other)


def test_a_subclass_loaded_by_path_gets_its_own_name():
    reg = Registry("method")
    reg.register("parent")(PluginMethod)
    cls = reg.get(f"{__name__}:Child")
    assert cls.name == f"{__name__}:Child"


class Child(PluginMethod):
    pass


NOT_A_CLASS = object()


def test_a_broken_plugin_is_named_and_the_others_still_load(monkeypatch):
    good = EntryPoint(name="plugin", value=f"{__name__}:PluginMethod", group="kvbench.methods")
    broken = EntryPoint(name="broken", value="no_such_module_anywhere:Thing",
                        group="kvbench.methods")
    odd = EntryPoint(name="odd", value=f"{__name__}:NOT_A_CLASS", group="kvbench.methods")
    monkeypatch.setattr(registry_module, "entry_points", lambda group: [broken, odd, good])
    reg = Registry("method", entry_point_group="kvbench.methods")
    assert reg.names() == ["plugin"] and reg.get("plugin") is PluginMethod
    with pytest.raises(UnknownName, match="plug-in 'broken' failed to load.*ModuleNotFoundError"):
        reg.get("broken")
    with pytest.raises(UnknownName, match="plug-in 'odd' failed to load.*is not a class"):
        reg.get("odd")
    assert not hasattr(NOT_A_CLASS, "name")


def test_a_path_to_something_that_is_not_a_class_is_refused():
    with pytest.raises(UnknownName, match="is not a class"):
        Registry("method").get(f"{__name__}:NOT_A_CLASS")
    assert not hasattr(NOT_A_CLASS, "name")


def test_build_method_checks_parameters_as_strictly_as_a_suite():
    from kvbench.methods import build_method

    assert build_method("intq", {"bits": 4}).bits == 4
    for params, wrong in [({"bits": "4"}, "bits"), ({"bits": True}, "bits"),
                          ({"bitz": 4}, "bitz")]:
        with pytest.raises(ValueError, match=wrong):
            build_method("intq", params)
    with pytest.raises(ValueError, match="fit_beta"):
        build_method("am", {"ratio": 0.5, "fit_beta": "yes"})
    # a wrapper's base is built the same way: its __post_init__ refuses the lax value
    with pytest.raises(ValueError, match="bits"):
        build_method("sparse_v", {"base": "intq", "base_params": {"bits": "4"}})


def test_mlx_implementations_belong_to_their_exact_class():
    pytest.importorskip("mlx.core")
    from kvbench.methods import has_implementation, implementation
    from kvbench.methods.settings.intq import IntQ

    @dataclass
    class MyIntQ(IntQ):
        """A plug-in that changes the algorithm: IntQ's MLX twin would not run it."""

    assert has_implementation(IntQ, "mlx") and not has_implementation(MyIntQ, "mlx")
    with pytest.raises(NotImplementedError, match="no mlx implementation"):
        implementation(MyIntQ(), "mlx")


def test_a_builtin_is_imported_when_first_looked_up_and_its_table_entry_is_its_own_name():
    """The built-ins' table (name -> module) is the one list of them: looking a name up imports
    its module, which registers exactly that name."""
    import subprocess
    import sys

    probe = ("import sys, kvbench.methods, kvbench.benchmarks as b;"
             "before = sorted(m for m in sys.modules if m.startswith(('kvbench.methods.settings.',"
             " 'kvbench.benchmarks.specs.')));"
             "kvbench.methods.METHODS.get('turbo3');"
             "print(before, 'kvbench.methods.settings.turbo' in sys.modules,"
             " 'kvbench.methods.settings.intq' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split("] ")
    assert set(eval(out[0] + "]")) <= {"kvbench.methods.settings.base",  # noqa: S307
                                       "kvbench.methods.settings.wrapped",
                                       "kvbench.benchmarks.specs.base"}
    assert out[1].split() == ["True", "False"]

    from kvbench.benchmarks import BENCHMARKS
    from kvbench.methods import METHODS

    for registry in (METHODS, BENCHMARKS):
        for name in registry.builtins:
            assert registry.get(name).name == name


def test_a_table_entry_whose_module_does_not_register_it_is_named():
    reg = Registry("method", builtins={"ghost": "kvbench.methods.settings.identity"})
    with pytest.raises(UnknownName, match="importing kvbench.methods.settings.identity did not"):
        reg.get("ghost")


def test_every_builtin_method_names_the_module_of_each_implementation():
    """implemented_in is how a backend's implementation is found: a built-in registered in a
    module its settings do not name would be 'not implemented' in a fresh process."""
    from kvbench.methods import METHODS, has_implementation

    for name in METHODS.builtins:
        cls = METHODS.get(name)
        assert cls.implemented_in, name
        for backend in cls.implemented_in:
            if backend == "torch":
                assert has_implementation(cls, backend), name


def test_the_leaderboards_run_in_the_stated_order_and_a_plugins_board_comes_after():
    from kvbench.report.html import BOARD_ORDER, board_order

    present = ["stress", "proofs", "speed", "ruler"]
    assert board_order(present) == [kind for kind in BOARD_ORDER if kind in present]
    assert set(BOARD_ORDER) == set(__import__("kvbench.benchmarks", fromlist=["x"]).BENCHMARKS
                                   .builtins)
