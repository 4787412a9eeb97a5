"""Method lookup: registered names, `module:Class` paths, entry points, did-you-mean."""
from dataclasses import dataclass
from importlib.metadata import EntryPoint

import pytest

from kvbench import registry as registry_module
from kvbench.methods.base import Method
from kvbench.registry import Registry, UnknownName


@dataclass
class PluginMethod(Method):
    """A method that lives outside kvbench."""

    def new_layer_cache(self, layer_idx):
        raise NotImplementedError


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
