"""The tests mirror the library: ``tests/<package>/test_<module>.py`` for each module of
``fp8jax/``, ``models/`` (``tests/models/``) and ``experiments/`` (``tests/experiments/``),
or an entry in :data:`tests.project.covered_by.COVERED_BY` naming the test file that covers
it. Support code has fixed homes: references in ``tests/references/``, binaries, notebooks
and several-process tests in ``tests/integration/``, the project's own checks in
``tests/project/``."""

import pathlib

from tests.project.covered_by import COVERED_BY

REPO = pathlib.Path(__file__).resolve().parents[2]
# Library folder -> (installed package, folder of its tests under tests/).
ROOTS = {"fp8jax": ("fp8jax", ""), "models": ("fp8jax.models", "models"),
         "experiments": ("fp8jax.experiments", "experiments")}
SUPPORT_FOLDERS = {"references", "integration", "project"}


def library_modules() -> dict[str, pathlib.Path]:
  """Dotted module name -> the path of its mirrored test module (configs and packages'
  ``__init__`` excluded)."""
  out = {}
  for folder, (package, tests_folder) in ROOTS.items():
    for path in sorted((REPO / folder).rglob("*.py")):
      rel = path.relative_to(REPO / folder)
      if path.name == "__init__.py" or "configs" in rel.parts:
        continue
      name = ".".join([package, *rel.with_suffix("").parts])
      out[name] = REPO / "tests" / tests_folder / rel.parent / f"test_{path.name}"
  return out


def test_every_module_has_its_test_module_or_names_the_test_that_covers_it():
  modules = library_modules()
  untested = sorted(m for m, t in modules.items() if not t.exists() and m not in COVERED_BY)
  assert not untested, (
      "library modules with no tests/<package>/test_<module>.py: write it, or add the module "
      f"to COVERED_BY in tests/project/covered_by.py with the test that covers it: {untested}")
  unknown = sorted(set(COVERED_BY) - set(modules))
  assert not unknown, f"COVERED_BY names modules that do not exist: {unknown}"
  stale = sorted(m for m in COVERED_BY if modules[m].exists())
  assert not stale, f"COVERED_BY entries whose mirrored test module now exists: {stale}"
  missing = sorted(f"{m}: {t}" for m, t in COVERED_BY.items() if not (REPO / t).is_file())
  assert not missing, f"COVERED_BY names test files that do not exist: {missing}"


def test_test_folders_mirror_library_packages():
  packages = {"", "models", "experiments"}
  for folder, (_, tests_folder) in ROOTS.items():
    for init in (REPO / folder).rglob("__init__.py"):
      rel = init.parent.relative_to(REPO / folder)
      if "configs" not in rel.parts:
        packages.add(str(pathlib.Path(tests_folder) / rel).removeprefix("."))
  stray = []
  for path in sorted((REPO / "tests").rglob("test_*.py")):
    rel = path.parent.relative_to(REPO / "tests")
    top = rel.parts[0] if rel.parts else ""
    if top in SUPPORT_FOLDERS:
      continue
    if str(rel).removeprefix(".") not in packages or str(rel) == ".":
      stray.append(str(path.relative_to(REPO)))
  assert not stray, ("test files outside a folder that mirrors a library package (or "
                     f"references/, integration/, project/): {stray}")
  no_init = sorted(str(d.relative_to(REPO)) for d in (REPO / "tests").rglob("*")
                   if d.is_dir() and d.name != "__pycache__" and not (d / "__init__.py").exists()
                   and any(d.glob("*.py")))
  assert not no_init, f"test folders without __init__.py (their module names clash): {no_init}"
