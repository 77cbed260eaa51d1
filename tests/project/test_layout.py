"""The shape of the code: layered packages, no import cycles, a pinned public API, small files,
docstrings that state contracts rather than timings.

Imports are read from the source (``ast``, every ``import`` statement, including those
inside functions), not from ``sys.modules``, so a cycle hidden behind a function-level
import fails too.
"""

import ast
import functools
import io
import pathlib
import re
import tokenize

import fp8jax

REPO = pathlib.Path(__file__).resolve().parents[2]
# Repository folder -> installed package (see [tool.setuptools.package-dir]).
ROOTS = {"fp8jax": "fp8jax", "models": "fp8jax.models", "experiments": "fp8jax.experiments"}

_BELOW_STUDY = {"numerics", "kernels", "quant", "gemm", "api", "rules", "models", "data",
                "metrics", "train"}
_STUDY_ROOMS = ("study.common", "study.comparison", "study.branches", "study.runs",
                "study.formats")
# Each layer may import itself and the layers it lists. "api" is fp8jax/__init__.py.
ALLOWED = {
    "numerics": set(),
    "kernels": {"numerics"},
    "quant": {"numerics", "kernels"},
    "gemm": {"numerics", "kernels", "quant"},
    "rules": {"numerics", "kernels", "quant", "gemm"},
    "api": {"numerics", "kernels", "quant", "gemm", "rules"},
    "data": set(),
    "metrics": set(),
    # kernels: chosen in gemm; metrics: the Classifier of models/param_paths.py
    "models": {"numerics", "quant", "gemm", "api", "rules", "metrics"},
    "train": {"numerics", "kernels", "quant", "gemm", "api", "rules", "models", "data",
              "metrics"},
    # The study's rooms (fp8jax/study/<room>/); "study" is the package's own modules on top.
    "study.common": _BELOW_STUDY,
    "study.comparison": _BELOW_STUDY | {"study.common"},
    "study.branches": _BELOW_STUDY | {"study.common", "study.comparison"},
    "study.runs": _BELOW_STUDY | {"study.common", "study.comparison"},
    "study.formats": _BELOW_STUDY | {"study.common"},
    "study": _BELOW_STUDY | set(_STUDY_ROOMS),
    "experiments": _BELOW_STUDY | set(_STUDY_ROOMS) | {"study"},
}

PUBLIC_API = sorted([
    "Accumulation", "DelayedState", "FloatFormat", "GemmConfig", "Granularity", "QTensor",
    "QuantSpec", "QuantTelemetry", "RoleSpecs", "Rule", "Rules", "block", "compute_scale",
    "compute_scales", "deepseek_v3_roles", "dequantize", "describe", "dot_general_fn",
    "fake_quant", "fp8_dot_general", "fp8_einsum", "get_format", "intercept", "per_axis",
    "per_tensor", "preset", "quantize", "quantize_and_update", "quantize_dequantize",
    "quantize_gemms", "quantize_model", "recipe", "round_pow2", "saturating_cast", "tile",
])

MAX_LINES = 400
"""Python files (library, binaries, scripts, tests, and the notebooks' ``.py`` sources, which
stand for their ``.ipynb`` pairs) stay under this many lines."""
SMALL_FOLDERS = ("fp8jax", "models", "experiments", "scripts", "tests", "colab")


def _modules() -> dict[str, pathlib.Path]:
  mods = {}
  for folder, package in ROOTS.items():
    for path in (REPO / folder).rglob("*.py"):
      parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      mods[".".join([package, *parts])] = path
  return mods


def _imports(path: pathlib.Path, mods: dict) -> set[str]:
  """The fp8jax modules that the file imports (a name imported from a package counts as
  the submodule when it is one, else as the package)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names if a.name.split(".")[0] == "fp8jax"}
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module.split(".")[0] != "fp8jax":
        continue
      for a in node.names:
        full = f"{node.module}.{a.name}"
        out.add(full if full in mods else node.module)
  return out


def _graph() -> dict[str, set[str]]:
  """Each module's fp8jax imports (read once per process: four tests read it)."""
  return {m: set(imported) for m, imported in _graph_once().items()}


@functools.cache
def _graph_once() -> dict[str, frozenset[str]]:
  mods = _modules()
  return {m: frozenset(i for i in _imports(p, mods) if i != m) for m, p in mods.items()}


def layer_of(module: str) -> str:
  """``fp8jax.quant.qtensor`` -> ``quant``; the top-level ``fp8jax`` -> ``api``; a module of
  a study room, ``fp8jax.study.comparison.sweep`` -> ``study.comparison``."""
  parts = module.split(".")
  if len(parts) > 2 and ".".join(parts[1:3]) in _STUDY_ROOMS:
    return ".".join(parts[1:3])
  return "api" if len(parts) == 1 else parts[1]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  stack: list[str] = []

  def visit(m):
    state[m] = 1
    stack.append(m)
    for n in sorted(graph.get(m, ())):
      if state.get(n) == 1:
        return stack[stack.index(n):] + [n]
      if n not in state and (found := visit(n)):
        return found
    stack.pop()
    state[m] = 2
    return None

  for m in sorted(graph):
    if m not in state and (found := visit(m)):
      return found
  return None


def test_find_cycle_finds_one():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_layer_of_names_the_study_rooms():
  assert layer_of("fp8jax.study.comparison.sweep") == "study.comparison"
  assert layer_of("fp8jax.study.common") == "study.common"
  assert layer_of("fp8jax.study.sweep_report") == "study"
  assert layer_of("fp8jax.models.policy") == "models"
  assert layer_of("fp8jax") == "api"


def test_no_import_cycle():
  cycle = find_cycle(_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_has_a_layer():
  unknown = sorted(m for m in _graph() if layer_of(m) not in ALLOWED)
  assert not unknown, (f"modules outside the layers of tests/project/test_layout.py: {unknown}; "
                       "add their package to ALLOWED")


def test_layers_import_only_the_layers_below():
  bad = []
  for module, imported in sorted(_graph().items()):
    layer = layer_of(module)
    for target in sorted(imported):
      other = layer_of(target)
      if other != layer and other not in ALLOWED.get(layer, set()):
        bad.append(f"{module} ({layer}) imports {target} ({other})")
  assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_public_api_is_pinned():
  assert sorted(fp8jax.__all__) == PUBLIC_API
  missing = [n for n in PUBLIC_API if not hasattr(fp8jax, n)]
  assert not missing, f"fp8jax.__all__ names that do not resolve: {missing}"
  # Functions and classes only: modules are reached through their package, tables
  # (FORMATS, PRESETS, RECIPES) through their module.
  not_callable = [n for n in PUBLIC_API if not callable(getattr(fp8jax, n))]
  assert not not_callable, f"fp8jax.__all__ names that are not functions or classes: {not_callable}"


def test_source_files_are_small():
  sources = [p for folder in SMALL_FOLDERS for p in (REPO / folder).rglob("*.py")]
  assert len(sources) > 50
  assert {p.relative_to(REPO).parts[0] for p in sources} == set(SMALL_FOLDERS)
  big = sorted(f"{p.relative_to(REPO)}: {n} lines" for p in sources
               if (n := len(p.read_text().splitlines())) > MAX_LINES)
  assert not big, f"source files over {MAX_LINES} lines (split them by concern):\n" + \
      "\n".join(big)


# Names of DeepSeek-MoE's params tree and modules (models/param_paths.py), which the
# model-agnostic metrics take from a classifier instead of knowing them.
DEEPSEEK_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "self_attn", "embed_tokens",
                  "lm_head", "layernorm", "gate_proj", "experts_", "attn_q", "attn_o",
                  "routed_experts", "shared_experts", "dense_mlp")


def test_metrics_know_no_deepseek_names():
  sources = sorted((REPO / "fp8jax" / "metrics").rglob("*.py"))
  assert len(sources) > 5
  found = sorted(f"{p.relative_to(REPO)}: {name!r}" for p in sources
                 for name in DEEPSEEK_NAMES if name in p.read_text())
  assert not found, ("fp8jax/metrics names DeepSeek-MoE's modules (they belong in "
                     "models/param_paths.py):\n" + "\n".join(found))


DEEPSEEK_IMPORTERS = {  # above models/, the DeepSeek-MoE-only tools
    "fp8jax.train.params_io": "HF <-> Orbax conversion of DeepSeek-MoE checkpoints",
    "fp8jax.study.formats.model_site": "the numerics study at DeepSeek-MoE's sites",
}
"""The modules above ``models/`` that may import DeepSeek-MoE's own code
(``models/deepseek_moe.py``); everything else reaches it through the model interface: its
registry entry, ``fp8jax.models.deepseek_model``, or the registry by name."""


def test_only_deepseek_tools_import_deepseek_moe_above_models():
  bad = sorted(m for m, imported in _graph().items()
               if layer_of(m) not in ("models", "experiments")
               and "fp8jax.models.deepseek_moe" in imported and m not in DEEPSEEK_IMPORTERS)
  assert not bad, ("modules above models/ that import DeepSeek-MoE directly (take an "
                   f"fp8jax.models.api.Model instead): {bad}")


DEEPSEEK_SHORTCUTS = ("fp8jax.models.deepseek_model", "fp8jax.models.config",
                      "fp8jax.models.policy")
"""DeepSeek-MoE's model entry, its ``ModelConfig`` and its ``PrecisionPolicy`` grammar."""

DEEPSEEK_SHORTCUT_IMPORTERS = {  # above models/, each with why it still must
    **DEEPSEEK_IMPORTERS,  # the DeepSeek-MoE-only tools (its configs, sites and policies)
    "fp8jax.study.common.legacy_records":
        "rebuilds the records of sweep folders written before records, by parsing policies",
    "fp8jax.study.comparison.policies":
        "expands DeepSeek-MoE's named grids at its depth (deepseek_model.expand)",
}
"""The modules above ``models/`` (the binaries included) that may import
:data:`DEEPSEEK_SHORTCUTS`; everything else takes an ``fp8jax.models.api.Model``, built by
``fp8jax.models.registry`` (DeepSeek-MoE's registry entry builds it from a config)."""


def test_only_listed_modules_import_deepseeks_config_policy_or_model_above_models():
  graph = _graph()
  bad = sorted(f"{m}: {sorted(hit)}" for m, imported in graph.items()
               if layer_of(m) != "models" and m not in DEEPSEEK_SHORTCUT_IMPORTERS
               and (hit := imported & set(DEEPSEEK_SHORTCUTS)))
  assert not bad, ("modules above models/ that import DeepSeek-MoE's model, config or "
                   "policy (take an fp8jax.models.api.Model, from fp8jax.models.registry):\n"
                   + "\n".join(bad))
  stale = sorted(m for m in DEEPSEEK_SHORTCUT_IMPORTERS
                 if not graph.get(m, set()) & set(DEEPSEEK_SHORTCUTS))
  assert not stale, f"allowed importers that import none of them now (remove them): {stale}"


TIMING = re.compile(r"\d(?:[\d.,]*\d)?[kKM]?\s?(?:ms|us|µs|tokens/s|tok/s|TFLOP/s)(?![\w/])")
DEVICE = re.compile(r"\b(?:GH200|GB200|H100|H200|B200|A100|MI300X?|L40S?)\b")
GIB = re.compile(r"\d(?:[\d.]*\d)?\s?GiB\b")
TIMING_ALLOWED: dict[str, str] = {}
"""``path:line`` of a docstring or comment that may keep a timing, with the reason (none
now). Timings age with every kernel change: they belong in docs/performance.md and its
dated archive, which a docstring points to."""


def _prose(path: pathlib.Path):
  """``(line, text)`` of every docstring (any string statement) and comment block of a file."""
  src = path.read_text()
  for node in ast.walk(ast.parse(src, str(path))):
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
        and isinstance(node.value.value, str):
      yield node.lineno, node.value.value
  block: list = []  # consecutive comment lines read as one text
  for tok in [*tokenize.generate_tokens(io.StringIO(src).readline), None]:
    if tok is not None and tok.type != tokenize.COMMENT:
      continue
    if block and (tok is None or tok.start[0] != block[-1][0] + 1):
      yield block[0][0], "\n".join(t for _, t in block)
      block = []
    if tok is not None:
      block.append((tok.start[0], tok.string))


def test_library_prose_states_no_timings():
  assert TIMING.search("took 0.93 ms") and TIMING.search("133.8k tokens/s")
  assert not TIMING.search("128 x 128 tiles, 3 items")
  found = []
  for folder in ("fp8jax", "models"):
    for path in sorted((REPO / folder).rglob("*.py")):
      for line, text in _prose(path):
        where = f"{path.relative_to(REPO)}:{line}"
        # one sentence that names both a GiB figure and a device is a measurement too
        sentences = re.split(r"(?<=[.;])\s+|\n\s*\n", text)
        hits = TIMING.findall(text) + [GIB.search(s)[0] for s in sentences
                                       if GIB.search(s) and DEVICE.search(s)]
        if hits and where not in TIMING_ALLOWED:
          found.append(f"{where}: {hits}")
  assert not found, ("timings in library docstrings or comments (state the contract and "
                     "point to docs/performance.md or docs/performance/archive/):\n"
                     + "\n".join(found))
