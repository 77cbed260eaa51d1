"""Models by name: ``"family:size"`` -> :class:`fp8jax.models.api.Model`.

    registry.get("deepseek_moe:2b")                       # DeepSeek-MoE 2B
    registry.get("llama:tiny", overrides={"num_layers": 4})
    registry.get("mixtral:tiny")                          # a Mixtral-style sparse MoE
    registry.get("tiny")                                  # DeepSeek-MoE's own names too

A family is a factory ``(size, overrides, options) -> Model``: ``overrides`` change
fields of the size's config (a field the config lacks is refused by name), ``options``
say how the model computes (DeepSeek-MoE: ``moe_impl``, ``moe_groups``, ``deterministic``,
``scan``; a family refuses options it does not have). :func:`register` adds a family;
a new model is one file and one ``register`` call. A family not registered yet is
imported as the module of its name (``my_lm:tiny``: ``import my_lm``), which registers it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
import functools
import importlib
from typing import Any

from fp8jax.models import api

Factory = Callable[[str, Mapping[str, Any], Mapping[str, Any]], api.Model]
_FAMILIES: dict[str, Factory] = {}
_SIZES: dict[str, Callable[[], tuple[str, ...]]] = {}


def register(family: str, factory: Factory, sizes: Callable[[], tuple[str, ...]]) -> None:
  """Adds the model family ``family`` (``sizes``: its size names, for messages)."""
  if not family or ":" in family:
    raise ValueError(f"a model family name must be non-empty without ':', got {family!r}")
  _FAMILIES[family], _SIZES[family] = factory, sizes


def _split(name: str) -> tuple[str, str]:
  from fp8jax.models import config as deepseek_config  # DeepSeek-MoE's bare size names
  if name in deepseek_config.CONFIGS:
    return "deepseek_moe", name
  family, colon, size = name.partition(":")
  if colon and family not in _FAMILIES:
    _import_family(family)
  if not colon or family not in _FAMILIES:
    raise ValueError(f"unknown model {name!r}; known: {known()}")
  return family, size


def _import_family(family: str) -> None:
  """Imports the module named ``family`` (on the Python path, e.g. ``my_lm.py`` in the
  working directory), which registers it: a model of your own in every binary. A module
  that does not exist leaves the family unknown."""
  if not all(part.isidentifier() for part in family.split(".")):
    return
  try:
    importlib.import_module(family)
  except ModuleNotFoundError as e:
    if e.name is None or not (family == e.name or family.startswith(e.name + ".")):
      raise


def known() -> list[str]:
  """Every registered ``family:size`` name."""
  _builtin()
  return sorted(f"{f}:{s}" for f, sizes in _SIZES.items() for s in sizes())


def get(name: str, overrides: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None) -> api.Model:
  """The model called ``name`` (``family:size``, or a DeepSeek-MoE config name such as
  ``tiny`` or ``deepseek_moe_2b``) with its config's fields ``overrides`` and its
  computing ``options``. Raises ValueError naming an unknown model, size, field or
  option."""
  _builtin()
  family, size = _split(name)
  return _FAMILIES[family](size, dict(overrides or {}), dict(options or {}))


def replace_fields(config, overrides: Mapping[str, Any]):
  """``dataclasses.replace(config, **overrides)``, refusing unknown fields by name."""
  check_fields(type(config), overrides)
  return dataclasses.replace(config, **overrides)


def check_fields(cls, overrides: Mapping[str, Any], label: str = "model_overrides keys"
                 ) -> None:
  """Raises ValueError naming the keys of ``overrides`` that are not fields of ``cls``."""
  fields = {f.name for f in dataclasses.fields(cls)}
  bad = sorted(set(overrides) - fields)
  if bad:
    raise ValueError(f"unknown {label} {bad}; {cls.__name__} fields: {sorted(fields)}")


def _no_options(family: str, options: Mapping[str, Any]) -> None:
  if options:
    raise ValueError(f"the model family {family!r} has no options {sorted(options)}")


def _deepseek(size, overrides, options):
  from fp8jax.models import config as config_lib
  from fp8jax.models import deepseek_model
  name = size if size in config_lib.CONFIGS else f"deepseek_moe_{size}"
  if name not in config_lib.CONFIGS:
    raise ValueError(f"unknown DeepSeek-MoE size {size!r}; known: {_deepseek_sizes()}")
  check_fields(config_lib.ModelConfig, overrides)
  check_fields(deepseek_model.Options, options, "DeepSeek-MoE options")
  return deepseek_model.model(config_lib.get_config(name, **overrides),
                              deepseek_model.Options(**options))


def _deepseek_sizes() -> tuple[str, ...]:
  from fp8jax.models import config as config_lib
  return tuple(n.removeprefix("deepseek_moe_") for n in config_lib.CONFIGS)


def _rules_family(family: str, size, overrides, options):
  """A family of ``fp8jax.models.<family>`` (its ``CONFIGS`` by size and ``model``):
  the models quantized by rules that fp8jax ships (``llama``, ``mixtral``)."""
  module = importlib.import_module(f"fp8jax.models.{family}")
  _no_options(family, options)
  if size not in module.CONFIGS:
    raise ValueError(f"unknown {family} size {size!r}; known: {sorted(module.CONFIGS)}")
  return module.model(replace_fields(module.CONFIGS[size], overrides),
                      name=f"{family}:{size}")


def _rules_family_sizes(family: str) -> tuple[str, ...]:
  return tuple(importlib.import_module(f"fp8jax.models.{family}").CONFIGS)


def _builtin() -> None:
  """Registers the families fp8jax ships (once; imports happen at first use)."""
  if "deepseek_moe" not in _FAMILIES:
    register("deepseek_moe", _deepseek, _deepseek_sizes)
    for family in ("llama", "mixtral"):
      register(family, functools.partial(_rules_family, family),
               functools.partial(_rules_family_sizes, family))
    nano_moe = lambda: importlib.import_module("fp8jax.models.thirdparty_nano_moe")
    register("nano_moe", lambda *args: nano_moe().family(*args), lambda: nano_moe().sizes())
