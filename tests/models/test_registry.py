"""Models by name (``fp8jax.models.registry``): the families fp8jax ships, a family of
one's own registered or imported by its name, and unknown models, sizes, fields and
options refused by name."""

import dataclasses
import sys

import pytest

from fp8jax.models import config, registry


@pytest.fixture
def families(monkeypatch):
  """The registry's tables, restored after the test (the built-in families registered)."""
  registry.known()
  monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
  monkeypatch.setattr(registry, "_SIZES", dict(registry._SIZES))


@pytest.fixture
def module_file(monkeypatch, tmp_path):
  """``write(name, text)``: a module ``name`` on the Python path, forgotten after the test."""
  monkeypatch.syspath_prepend(str(tmp_path))
  names = []

  def write(name, text):
    (tmp_path / f"{name}.py").write_text(text)
    names.append(name)

  yield write
  for name in names:
    sys.modules.pop(name, None)


@dataclasses.dataclass(frozen=True)
class _Config:
  width: int = 8
  depth: int = 2


def test_registry_names_every_model_and_refuses_unknown_ones_by_name():
  assert {"deepseek_moe:2b", "deepseek_moe:tiny", "llama:tiny", "llama:small"} <= set(
      registry.known())
  assert registry.get("tiny").config == config.tiny()
  assert registry.get("deepseek_moe:2b").config == config.deepseek_moe_2b()
  assert registry.get("llama:tiny", {"num_layers": 3}).config.num_layers == 3
  for args, match in ((("gpt:x",), "unknown model 'gpt:x'; known: .*llama:tiny"),
                      (("llama:huge",), "unknown llama size 'huge'"),
                      (("llama:tiny", {"depth": 2}), r"unknown model_overrides keys \['depth'\]"),
                      (("tiny", None, {"kernel": "x"}), r"DeepSeek-MoE options \['kernel'\]"),
                      (("llama:tiny", None, {"scan": True}), r"'llama' has no options")):
    with pytest.raises(ValueError, match=match):
      registry.get(*args)


def test_unknown_deepseek_sizes_and_names_without_a_family_are_refused_by_name():
  with pytest.raises(ValueError, match=r"unknown DeepSeek-MoE size 'huge'; known: \(.*'tiny'"):
    registry.get("deepseek_moe:huge")
  with pytest.raises(ValueError, match=r"unknown model 'llama'; known: \["):
    registry.get("llama")  # a family without its size
  with pytest.raises(ValueError, match=r"unknown model 'my-lm:tiny'"):
    registry.get("my-lm:tiny")  # not a module name: nothing imported


def test_a_registered_family_gets_the_size_overrides_and_options(families):
  calls = []
  registry.register("toy", lambda *args: calls.append(args) or "the model",
                    lambda: ("s", "m"))
  assert registry.get("toy:m", {"depth": 3}, {"fast": True}) == "the model"
  assert registry.get("toy:s") == "the model"
  assert calls == [("m", {"depth": 3}, {"fast": True}), ("s", {}, {})]
  assert {"toy:s", "toy:m"} <= set(registry.known())


@pytest.mark.parametrize("name", ["", "toy:x"])
def test_a_family_name_that_is_empty_or_has_a_colon_is_refused(families, name):
  with pytest.raises(ValueError, match=rf"non-empty without ':', got {name!r}"):
    registry.register(name, lambda *args: None, lambda: ())


def test_an_unregistered_family_is_imported_by_its_name(families, module_file):
  name = "fp8jax_test_registry_lm"
  module_file(name, "from fp8jax.models import registry\n"
              f"registry.register({name!r}, lambda size, o, p: ('built', size, o), "
              "lambda: ('one',))\n")
  assert registry.get(f"{name}:one", {"d": 1}) == ("built", "one", {"d": 1})
  assert f"{name}:one" in registry.known()


def test_a_family_module_missing_a_dependency_raises_that_not_unknown_model(
    families, module_file):
  name = "fp8jax_test_registry_broken"
  module_file(name, "import fp8jax_test_no_such_dependency\n")
  with pytest.raises(ModuleNotFoundError, match="fp8jax_test_no_such_dependency"):
    registry.get(f"{name}:tiny")
  with pytest.raises(ValueError, match="unknown model 'fp8jax_test_absent:tiny'"):
    registry.get("fp8jax_test_absent:tiny")  # no such module: an unknown model


def test_replace_fields_changes_known_fields_and_names_unknown_ones():
  assert registry.replace_fields(_Config(), {"depth": 5}) == _Config(width=8, depth=5)
  with pytest.raises(ValueError, match=r"^unknown model_overrides keys \['colour', 'height'\]; "
                                       r"_Config fields: \['depth', 'width'\]$"):
    registry.replace_fields(_Config(), {"height": 1, "colour": 2, "depth": 1})
  with pytest.raises(ValueError, match=r"^unknown options \['x'\]"):
    registry.check_fields(_Config, {"x": 1}, "options")
