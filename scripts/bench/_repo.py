"""Makes the repository importable as installed (``models/`` as ``fp8jax.models``,
``experiments/`` as ``fp8jax.experiments``) on machines where the package is not
installed, e.g. the GPU image. Import this before anything from fp8jax."""

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import fp8jax  # noqa: E402,F401

for _name in ("models", "experiments"):
  if f"fp8jax.{_name}" in sys.modules:
    continue
  try:
    importlib.import_module(f"fp8jax.{_name}")
  except ImportError:
    _spec = importlib.util.spec_from_file_location(
        f"fp8jax.{_name}", ROOT / _name / "__init__.py",
        submodule_search_locations=[str(ROOT / _name)])
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[f"fp8jax.{_name}"] = _mod
    _spec.loader.exec_module(_mod)
