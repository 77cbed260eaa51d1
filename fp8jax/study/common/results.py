"""The data model of a precision comparison sweep folder (:mod:`fp8jax.study.comparison.sweep`).

A sweep folder holds ``meta.json`` (model, policies with their directly quantized modules,
checkpoint steps, evaluation windows), ``rows.jsonl`` (metrics per checkpoint step,
evaluation batch and FP8 policy), ``details.jsonl`` (per-parameter and module x layer
gradient difference norms), ``baseline.jsonl`` (the reference's losses per batch) and
``weights.jsonl`` (weight norms per step). The reference is the model's baseline policy (no
quantization), in its own precision (:attr:`Results.reference`: BF16 for DeepSeek-MoE);
columns keep their historical names (``loss_bf16``, ``norm_bf16``) whatever it is. Norms
are L2 norms of gradients (loss units per parameter unit), ``rel_err`` = ||g_fp8 -
g_bf16|| / ||g_bf16|| and ``loss_rel_err`` are dimensionless, losses are in nats per
token; steps are optimizer steps, offsets are in batches.

:func:`load` reads a folder into :class:`Results` (a torn last JSONL line, left by a killed
writer, is dropped; later duplicates of a row replace earlier ones). A (checkpoint, batch)
whose BF16 baseline is non-finite is a data problem, not an FP8 result: it is listed by
:meth:`Results.baseline_nonfinite`, and FP8 rows compared against it (written by sweeps of
earlier versions) are left out. The statistics over it are in :mod:`fp8jax.study.common.stats`.

``meta.json`` gives every entry of ``policies`` a ``kind``: ``"policy"`` (a precision policy
compared with BF16), ``"floor"`` (the noise floor: a BF16 gradient at weights perturbed at
BF16 rounding level, ``w * (1 + 2^-8 U(-1, 1))``, against the BF16 one; its rows also hold
``perturbation_norm`` and ``curvature`` = diff_norm / perturbation_norm) or ``"control"``
(a noise-matched control ``noise(<policy>)``: each quantization error of the policy
``control_of`` replaced by unbiased noise of the same energy per block). Folders written
before kinds existed have none: every entry is a policy and there is no floor. A policy's
entry carries its ``record`` (:mod:`fp8jax.models.policy_record`: sites, GEMM recipe,
site-grid cell; :meth:`Results.record`), which the questions read instead of its name;
entries written before records are read by :mod:`fp8jax.study.common.legacy_records`.
:attr:`Results.policies` lists the policies only (the questions, grids and rankings are
over them); :attr:`Results.floor` and :attr:`Results.controls` name the others.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
import dataclasses
import pathlib

from fp8jax.metrics import paths as paths_lib
from fp8jax.models import param_paths, policy_record
from fp8jax.study.common import legacy_records, results_io
from fp8jax.train import metrics_log

FILES = ("meta.json", "rows.jsonl", "details.jsonl", "baseline.jsonl", "weights.jsonl")
"""The files of a sweep folder."""

def depth_layers(depth: str) -> int:
  """How many layers a depth label covers: ``"l0"`` -> 1, ``"l0-8"`` -> 9."""
  lo, _, hi = depth[1:].partition("-")
  return int(hi or lo) - int(lo) + 1


# --- loading -----------------------------------------------------------------------------

def numbered_jsonl(path: str | pathlib.Path) -> list[tuple[int, dict]]:
  """``(line number, object)`` of each line of a JSONL file; a torn (unparsable) last line
  is dropped.

  Raises:
    FileNotFoundError: the file does not exist.
    ValueError: a line other than the last is not a JSON object (``file:line`` named).
  """
  path = pathlib.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"file {path.name} not found in {path.parent}")
  return metrics_log.numbered_lines(path)


def read_jsonl(path: str | pathlib.Path) -> list[dict]:
  """The objects of a JSONL file (:func:`numbered_jsonl` without the line numbers)."""
  return [obj for _, obj in numbered_jsonl(path)]


ROW_KEYS = ("step", "offset", "batch", "policy")
"""The columns that identify a row or details line (:func:`row_key`); a ``baseline.jsonl``
line has the first three."""
STATUS_KEYS = ("finite", "nonfinite")
"""The columns of a row or baseline line that say whether it is finite, and where not."""


def row_key(row: dict) -> tuple:
  """``(step, offset, batch, policy)``: what identifies a row or details line."""
  step, offset, batch, policy = (row[k] for k in ROW_KEYS)
  return (int(step), int(offset), int(batch), policy)


@dataclasses.dataclass
class Results:
  """A loaded sweep: ``meta`` and the lines of each JSONL file (dicts; later duplicates of
  one (step, offset, batch, policy) replace earlier ones)."""

  folder: pathlib.Path
  meta: dict
  rows: list[dict]
  details: list[dict]
  baseline: list[dict]
  weights: list[dict]

  def __post_init__(self):
    bad = {row_key({**b, "policy": None})[:3] for b in self.baseline_nonfinite()}
    if bad:  # FP8 rows against a non-finite baseline compare with garbage: not results
      self.rows = [r for r in self.rows if row_key(r)[:3] not in bad]
      self.details = [d for d in self.details if row_key(d)[:3] not in bad]
    self._by = defaultdict(list)
    for r in self.rows:
      self._by[(r["policy"], int(r["step"]))].append(r)
    finite = {row_key(r) for r in self.rows if r["finite"]}
    self._details = defaultdict(list)
    for d in self.details:
      if row_key(d) in finite:
        self._details[(d["policy"], int(d["step"]))].append(d)
    self._records: dict[str, dict] = {}

  @property
  def reference(self) -> str:
    """The reference's precision as the report names it (``"BF16"``, ``"FP32"``):
    ``meta["reference"]["precision"]``, which the sweep reads from the model's baseline
    (:meth:`fp8jax.models.api.Model.reference_precision`), upper case. A folder written
    before the sweep recorded it reads as BF16 (DeepSeek-MoE's BF16 baseline)."""
    return str((self.meta.get("reference") or {}).get("precision") or "bf16").upper()

  @property
  def classifier(self) -> paths_lib.Classifier:
    """The grouping of the model's parameter paths: the one ``meta.json`` records
    (``classes``), else DeepSeek-MoE's (sweeps written before it was recorded)."""
    table = self.meta.get("classes")
    if table:
      return paths_lib.Classifier.from_table(table)
    return param_paths.DEEPSEEK

  def record(self, name: str) -> dict:
    """The policy record of the entry ``name`` of ``meta["policies"]``
    (:mod:`fp8jax.models.policy_record`: its sites, GEMM recipe and site-grid cell); an
    entry written before entries had one is read by
    :func:`fp8jax.study.common.legacy_records.legacy_record`.

    Raises:
      ValueError: the record is of another schema version, or an old entry is ambiguous.
    """
    if name not in self._records:
      entry = self.meta["policies"].get(name, {})
      if "record" in entry:
        self._records[name] = policy_record.check(entry["record"],
                                                  f"meta.json policies[{name!r}]")
      else:
        self._records[name] = legacy_records.legacy_record(name, entry,
                                                           self.meta.get("model"))
    return self._records[name]

  def cell(self, name: str) -> tuple[str, str, str] | None:
    """``(module, depth, format)`` of a policy of the site grid's numerics, from its
    record's ``cell`` (:meth:`record`; None: other numerics)."""
    c = self.record(name)["cell"]
    return None if c is None else (c["module"], c["depth"], c["format"])

  def kind(self, name: str) -> str:
    """The kind of an entry of ``meta["policies"]``: "policy" (the default), "floor" or
    "control"."""
    return self.meta["policies"][name].get("kind", "policy")

  @property
  def names(self) -> list[str]:
    """Every entry of ``meta["policies"]`` (policies, floor, controls), in its order."""
    return list(self.meta["policies"])

  @property
  def policies(self) -> list[str]:
    """The precision policies (kind "policy"), in the order of ``meta.json``."""
    return [n for n in self.names if self.kind(n) not in ("floor", "control")]

  @property
  def floor(self) -> str | None:
    """The name of the noise floor's entry, or None (a sweep without one)."""
    return next((n for n in self.names if self.kind(n) == "floor"), None)

  @property
  def controls(self) -> dict[str, str]:
    """``{control name: the policy it controls}`` of the noise-matched controls."""
    return {n: self.meta["policies"][n].get("control_of", "") for n in self.names
            if self.kind(n) == "control"}

  def control_for(self, policy: str) -> str | None:
    """The noise-matched control of a policy, or None."""
    return next((c for c, b in self.controls.items() if b == policy), None)

  @property
  def steps(self) -> list[int]:
    """Checkpoint steps, ascending."""
    return sorted(int(s) for s in self.meta["steps"])

  def rows_of(self, policy: str, steps: Iterable[int] | None = None) -> list[dict]:
    """The rows (finite or not) of one policy at ``steps`` (default: all)."""
    return [r for s in (self.steps if steps is None else steps) for r in self._by[(policy, s)]]

  def details_of(self, policy: str, step: int) -> list[dict]:
    """The details lines of one policy and step whose row is finite."""
    return self._details[(policy, int(step))]

  def nonfinite(self) -> list[dict]:
    """The FP8 rows with ``finite: false``, in (step, policy, offset, batch) order."""
    return sorted((r for r in self.rows if not r["finite"]),
                  key=lambda r: (r["step"], r["policy"], r["offset"], r["batch"]))

  def baseline_nonfinite(self) -> list[dict]:
    """The baseline lines with ``finite: false`` (a bad checkpoint or batch), in (step,
    offset, batch) order."""
    return sorted((b for b in self.baseline if not b.get("finite", True)),
                  key=lambda b: (b["step"], b["offset"], b["batch"]))

  def direct(self, policy: str) -> list[tuple[str, int | None]]:
    """The directly quantized ``(module, layer)`` pairs of a policy."""
    return [(m, None if lay is None else int(lay))
            for m, lay in self.meta["policies"][policy].get("direct", [])]


def _dedup(items: list[dict], key, keep_first: bool = False) -> list[dict]:
  """One item per ``key``, in the order keys first appear: the last of each (the first with
  ``keep_first``)."""
  kept: dict = {}
  for x in items:
    k = key(x)
    if not keep_first or k not in kept:
      kept[k] = x
  return list(kept.values())


def _baseline_key(line: dict) -> tuple:
  return row_key({**line, "policy": None})


def _weights_key(line: dict) -> int:
  return int(line["step"])


KINDS = ("policy", "floor", "control")
"""The kinds of the entries of ``meta["policies"]``."""


def _check_kinds(path: pathlib.Path, entries: dict) -> None:
  kinds = {n: e.get("kind", "policy") for n, e in entries.items()}
  for n, k in kinds.items():
    if k not in KINDS:
      raise ValueError(f"{path}: policies[{n!r}] has kind {k!r}, not one of {KINDS}")
    base = entries[n].get("control_of")
    if k == "control" and kinds.get(base) != "policy":
      raise ValueError(f"{path}: control {n!r} has control_of {base!r}, not a policy of the "
                       "sweep")
  floors = [n for n, k in kinds.items() if k == "floor"]
  if len(floors) > 1:
    raise ValueError(f"{path}: more than one floor: {floors}")


def load(folder: str | pathlib.Path) -> Results:
  """Reads a sweep folder.

  Raises:
    FileNotFoundError: a file of :data:`FILES` is missing (named in the message).
    ValueError: a line names a policy or step that ``meta.json`` does not list, or lacks
      an identifying key; a ``meta.json`` entry has an unknown kind, a control names no
      policy of the sweep, or there is more than one floor.
  """
  folder = pathlib.Path(folder)
  meta_path = folder / "meta.json"
  if not meta_path.exists():
    raise FileNotFoundError(f"sweep file meta.json not found in {folder}")
  meta = results_io.read_meta(meta_path, ("policies", "steps"))
  data = {name: read_jsonl(folder / f"{name}.jsonl")
          for name in ("rows", "details", "baseline", "weights")}
  _check_kinds(meta_path, meta["policies"])
  policies, steps = set(meta["policies"]), {int(s) for s in meta["steps"]}
  need = {"rows": ("step", "offset", "batch", "policy", "finite"),
          "details": ("step", "offset", "batch", "policy"),
          "baseline": ("step", "offset", "batch"), "weights": ("step",)}
  for name, items in data.items():
    for x in items:
      missing = [k for k in need[name] if k not in x]
      if missing:
        raise ValueError(f"{name}.jsonl: a line lacks {missing}: {str(x)[:200]}")
      if int(x["step"]) not in steps:
        raise ValueError(f"{name}.jsonl: step {x['step']} is not in meta.json {sorted(steps)}")
      if "policy" in need[name] and x["policy"] not in policies:
        raise ValueError(f"{name}.jsonl: policy {x['policy']!r} is not in meta.json "
                         f"{sorted(policies)}")
  return Results(folder, meta, _dedup(data["rows"], row_key), _dedup(data["details"], row_key),
                 _dedup(data["baseline"], _baseline_key), _dedup(data["weights"], _weights_key))


_SAME = ("model", "data", "train_workdir")
"""The ``meta.json`` keys that parts of one sweep share: the same checkpoints and data."""


def merge(parts: list[Results]) -> Results:
  """One sweep from sweeps of the same checkpoints and data, each by its own process over
  a part of the policies or of the evaluation offsets (``scripts/gpu/one_step_loop.sh``
  and ``report --results=A,B`` merge such parts, which compiled or ran in parallel).

  Each row compares its policy with the baseline of its own part, so rows merge as they
  are; the baseline and weights lines of a (step, offset, batch) are those of the first
  part that has them. ``meta`` is the first part's, with the policies of all parts (in
  part order), the union of their steps and of their windows' offsets.

  Raises:
    ValueError: no parts; the parts differ in model, data, training run, the reference's
      precision (:attr:`Results.reference`) or in their windows other than the offsets;
      two parts define one policy differently, or name more than one floor between them.
  """
  if not parts:
    raise ValueError("merge: no sweeps to merge")
  first_meta = parts[0].meta
  policies: dict = {}
  for part in parts:
    for key in _SAME:
      if part.meta.get(key) != first_meta.get(key):
        raise ValueError(f"{part.folder}: meta.json {key} {part.meta.get(key)!r} differs from "
                         f"{parts[0].folder}'s {first_meta.get(key)!r}: not parts of one sweep")
    if part.reference != parts[0].reference:
      raise ValueError(f"{part.folder}: its reference computes in {part.reference}, "
                       f"{parts[0].folder}'s in {parts[0].reference}: not parts of one sweep")
    if _but_offsets(part.meta.get("windows")) != _but_offsets(first_meta.get("windows")):
      raise ValueError(f"{part.folder}: evaluation windows {part.meta.get('windows')} differ "
                       f"from {parts[0].folder}'s {first_meta.get('windows')} (other than in "
                       "their offsets)")
    for name, entry in part.meta["policies"].items():
      if name in policies and policies[name] != entry:
        raise ValueError(f"{part.folder}: policy {name!r} is defined differently in another "
                         "part")
      policies.setdefault(name, entry)
  _check_kinds(parts[0].folder, policies)
  meta = {**first_meta, "policies": policies,
          "steps": sorted({int(s) for p in parts for s in p.meta["steps"]})}
  if isinstance(first_meta.get("windows"), dict) and "offsets" in first_meta["windows"]:
    meta["windows"] = {**first_meta["windows"], "offsets": sorted(
        {int(o) for p in parts for o in p.meta["windows"].get("offsets", [])})}
  return Results(parts[0].folder, meta,
                 _dedup([r for p in parts for r in p.rows], row_key),
                 _dedup([d for p in parts for d in p.details], row_key),
                 _dedup([b for p in parts for b in p.baseline], _baseline_key, keep_first=True),
                 _dedup([w for p in parts for w in p.weights], _weights_key, keep_first=True))


def _but_offsets(windows):
  return {k: v for k, v in windows.items() if k != "offsets"} if isinstance(windows, dict) \
      else windows


def save(res: Results, folder: str | pathlib.Path) -> pathlib.Path:
  """Writes ``res`` as a sweep folder (the files of :data:`FILES`; :func:`load` reads it
  back). Returns the folder."""
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  results_io.write_json(folder / "meta.json", res.meta)
  for name in ("rows", "details", "baseline", "weights"):
    results_io.rewrite(folder / f"{name}.jsonl", getattr(res, name))
  return folder
