"""The report of a precision comparison sweep, on synthetic sweep folders with known numbers.

The builder here also serves ``tests/study/common/test_results.py`` (loading),
``tests/study/common/test_stats.py`` (statistics) and ``tests/study/comparison/test_floor.py``."""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from fp8jax.metrics import paths as paths_lib
from fp8jax.metrics import ranking
from fp8jax.models import deepseek_model
from fp8jax.models import param_paths as deepseek_paths
from fp8jax.models import policy as policy_lib
from fp8jax.models import policy_record as record_lib
from fp8jax.study import sweep_report
from fp8jax.study.common import results, stats
from fp8jax.study.comparison import figures, questions

REPO = pathlib.Path(__file__).resolve().parents[2]
SEED = [f"{m}_{d}_{f}" for m in ("attn", "moe") for d in ("l0", "l0-8") for f in ("e4m3", "e5m2")]
STEPS = (0, 100, 200, 300)
OFFSETS = (0, 8)
BATCHES = 2
NOISE = (1.0, 1.1, 0.9, 1.05)  # per-batch factor, shared by all policies (paired design)
LAYERS = 4
BAD = {"step": 100, "offset": 8, "batch": 0, "policy": "moe_l0-8_e5m2"}
BAD_WHERE = "fp8 grads/layers/1/mlp/experts_up"


def param_paths() -> list[str]:
  out = ["embed_tokens/embedding", "lm_head/kernel", "norm/scale"]
  for i in range(LAYERS):
    out += [f"layers/{i}/self_attn/{p}_proj/kernel" for p in "qkvo"]
    out += [f"layers/{i}/input_layernorm/scale", f"layers/{i}/post_attention_layernorm/scale"]
    if i == 0:
      out += [f"layers/0/mlp/{p}_proj/kernel" for p in ("gate", "up", "down")]
    else:
      out += [f"layers/{i}/mlp/gate/kernel", f"layers/{i}/mlp/experts_up",
              f"layers/{i}/mlp/experts_down", f"layers/{i}/mlp/shared_experts/up_proj/kernel"]
  return out


def seed_parts(name: str) -> tuple[str, ...] | None:
  """``(module, depth, format)`` of a site-grid name of this builder (``moe_l0-8_e5m2``),
  from which it makes its numbers; None for other names."""
  parts = tuple(name.split("_"))
  return parts if len(parts) == 3 and parts[0] in ("attn", "moe") else None


def policy_record(name: str) -> dict:
  """The record a sweep writes for the policy ``name`` parses to (an empty one for names
  that are no policy: the floor, ``custom``)."""
  try:
    return deepseek_model.policy_record(policy_lib.parse_policy(name), LAYERS)
  except ValueError:
    return record_lib.build(name, None)


def direct_pairs(policy: str) -> list[list]:
  module, depth, _ = seed_parts(policy) or ("attn", "l0", "")
  layers = [0] if depth == "l0" else list(range(LAYERS))
  mods = ["attn_o"] if module == "attn" else ["routed_experts", "shared_experts"]
  return [[m, i] for m in mods for i in layers]


def rel_err(policy: str, i: int, j: int, flip: bool) -> float:
  """E4M3 half of E5M2; one module decays, the other persists; its depths differ 3x, the
  other's 1.05x (flip swaps the modules' roles and the formats)."""
  module, depth, fmt = seed_parts(policy) or ("attn", "l0", "e4m3")
  decaying = (module == "attn") != flip
  base = 0.2 * 0.3 ** i if decaying else 0.03
  base *= (3.0 if decaying else 1.05) if depth != "l0" else 1.0
  base *= 1.0 if (fmt == "e4m3") != flip else 2.0
  return base * NOISE[j]


def per_param(policy: str, i: int, j: int) -> dict[str, float]:
  """Direct parameters dominate at the first checkpoint and fade later."""
  pred = paths_lib.as_predicate([tuple(p) for p in direct_pairs(policy)],
                                deepseek_paths.DEEPSEEK)
  u = np.random.default_rng(0).uniform(0.1, 1.0, len(param_paths()))
  return {p: float(u[n] * NOISE[j] * (10 * 0.2 ** i if pred(p) else 1.0))
          for n, p in enumerate(param_paths())}


def module_layer(values: dict[str, float]) -> dict[str, float]:
  cells: dict[str, float] = {}
  for p, v in values.items():
    if deepseek_paths.layer_of(p) is not None:
      key = f"{deepseek_paths.module_of(p)}/{deepseek_paths.layer_of(p)}"
      cells[key] = cells.get(key, 0.0) + v * v
  return {k: math.sqrt(v) for k, v in cells.items()}


FLOOR_NOISE = (1.0, 0.8, 1.25, 0.9)  # the floor's own per-batch factor (multiples vary)
PERTURBATION_NORM = 0.5


def floor_rel_err(i: int, j: int, scale: float = 1.0) -> float:
  """The synthetic noise floor's rel_err at checkpoint index i, batch index j."""
  return 0.01 * FLOOR_NOISE[j] * scale


def metric_row(ids: dict, name: str, r: float, lre: float, loss: float, i: int,
               moe: bool) -> dict:
  """A row of the sweep's metric fields for rel_err ``r`` and loss_rel_err ``lre``."""
  row = {**ids, "policy": name, "finite": True, "nonfinite": None, "loss_bf16": loss,
         "loss_fp8": loss * (1 + lre), "loss_abs_err": loss * lre, "loss_rel_err": lre,
         "diff_norm": 2.0 * r, "norm_bf16": 2.0, "norm_fp8": 2.0, "rel_err": r,
         "cosine": 1 - r * r / 2, "share_direct": 0.8 - 0.2 * i,
         "module/attn_o/diff_norm": r, "layer/0/rel_err": r}
  for lay in range(1, LAYERS):
    row[f"routing/{lay}/topk_set_diff_frac"] = 0.01 * lay * (1 + i) if moe else 0.005
    row[f"routing/{lay}/n_only_a"] = 0.0
    row[f"routing/{lay}/n_only_b"] = 0.0
  return row


def build(folder: pathlib.Path, policies=tuple(SEED), steps=STEPS, offsets=OFFSETS,
          batches=BATCHES, flip=False, floor=False, controls=None, grad_norm=None,
          floor_scale=None, extra=None, fields=None, records=False, reference=None
          ) -> pathlib.Path:
  """A sweep folder of known numbers. ``floor``: with a noise floor (:func:`floor_rel_err`);
  ``controls``: {policy: per-batch factors of its noise-matched control's rel_err over the
  policy's}; ``grad_norm``: {step: BF16 gradient norm} (default 2); ``floor_scale``: {step:
  factor on the floor}; ``extra``: {policy name: f(i, j) -> rel_err}; ``fields``: {policy:
  f(i, j) -> further row fields}. Without floor and controls the meta has no kinds, without
  ``records`` no policy records (the formats of earlier sweeps); with ``records`` each
  entry has the record of the policy its name parses to; ``reference``: the precision
  ``meta.json`` records for the reference (None: none, as sweeps before the record)."""
  folder.mkdir(parents=True, exist_ok=True)
  controls, extra, fields = controls or {}, extra or {}, fields or {}
  kinds = bool(floor or controls)
  entries = {p: {"expr": p.replace("_", "@", 1), "direct": direct_pairs(p)}
             for p in (*policies, *extra)}
  for p in entries.values():
    p.update({"kind": "policy"} if kinds else {})
  for p in controls:
    entries[f"noise({p})"] = {"expr": f"noise({entries[p]['expr']})", "direct": direct_pairs(p),
                              "kind": "control", "control_of": p}
  if floor:
    entries["floor"] = {"expr": "floor", "direct": [], "kind": "floor", "scale": 2.0 ** -8}
  for name, entry in entries.items() if records else ():
    entry["record"] = policy_record(name)
  meta = {"model": {"num_hidden_layers": LAYERS, "hidden_size": 32, "n_routed_experts": 4},
          "policies": entries,
          "steps": list(steps), "windows": {"offsets": list(offsets), "batches": batches,
                                            "batch_size": 2, "seq_len": 16},
          "code_version": "abc1234-test", "train_workdir": "/runs/synthetic"}
  if reference:
    meta["reference"] = {"precision": reference, "gemm_share": {reference: 1.0}}
  (folder / "meta.json").write_text(json.dumps(meta))
  rows, details, base, weights = [], [], [], []
  for i, s in enumerate(steps):
    weights.append({"step": s, "weight_norm/global": 10.0 + i, "weight_norm/attn_q": 2.0 + i,
                    "weight_norm/routed_experts": 5.0 + 0.5 * i})
    for j, (o, b) in enumerate((o, b) for o in offsets for b in range(batches)):
      ids = {"step": s, "offset": o, "batch": b}
      loss = 5.0 - 0.5 * i + 0.01 * j
      base.append({**ids, "loss": loss, "lm_loss": loss, "aux_loss": 0.0,
                   "grad_norm": (grad_norm or {}).get(s, 2.0), "finite": True})
      for p in (*policies, *extra):
        module, _, fmt = seed_parts(p) or ("attn", "l0", "e4m3")
        r = extra[p](i, j) if p in extra else rel_err(p, i, j, flip)
        lre = 1e-3 * NOISE[j] * (1.0 if (fmt == "e4m3") != flip else 3.0)
        row = {**metric_row(ids, p, r, lre, loss, i, module == "moe"),
               **(fields[p](i, j) if p in fields else {})}
        pp = per_param(p, i, j)
        if {**ids, "policy": p} == BAD:
          row = {**{k: (math.nan if isinstance(v, float) else v) for k, v in row.items()},
                 "finite": False, "nonfinite": BAD_WHERE}
          pp = {k: 1e9 for k in pp}  # would dominate every ranking if it were used
        rows.append(row)
        details.append({**ids, "policy": p, "per_param": pp, "module_layer": module_layer(pp)})
        if p in controls:
          rows.append(metric_row(ids, f"noise({p})", r * controls[p][j], lre, loss, i,
                                 module == "moe"))
      if floor:
        fr = floor_rel_err(i, j, (floor_scale or {}).get(s, 1.0))
        row = metric_row(ids, "floor", fr, 1e-4 * FLOOR_NOISE[j], loss, i, False)
        row.update(share_direct=math.nan, perturbation_norm=PERTURBATION_NORM,
                   curvature=2.0 * fr / PERTURBATION_NORM)
        rows.append(row)
  for name, items in (("rows", rows), ("details", details), ("baseline", base),
                      ("weights", weights)):
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
  return folder


@pytest.mark.parametrize("flip", [False, True])
def test_answers_follow_the_data(tmp_path, flip):
  r = results.load(build(tmp_path / "s", flip=flip))
  ans = questions.answers(r, top_k=3)
  assert all(a["available"] for k, a in ans.items() if k != "narrowing")
  assert not ans["narrowing"]["available"]  # this grid has no GEMM recipes
  lower, higher = ("E5M2", "E4M3") if flip else ("E4M3", "E5M2")
  fmt = ans["format"]
  assert f"{lower} has lower rel_err than {higher} in 4 of 4 settings" in fmt["summary"]
  assert f"{lower} has lower loss_rel_err than {higher} in 4 of 4" in fmt["summary"]
  assert "the 95% interval excludes 1 in 4 of 4" in fmt["summary"]
  assert "Flagged" not in fmt["summary"]  # no checkpoint of this sweep is flagged
  attn = [s for s in fmt["settings"] if s["module"] == "attn"]
  assert [s["comparisons"]["rel_err"]["ratio"] for s in attn] == pytest.approx(
      [2.0 if flip else 0.5] * 2)
  decay, persist = ("MoE", "attention") if flip else ("attention", "MoE")
  mod = ans["module"]
  assert f"{persist} has lower rel_err than {decay} in 4 of 4" in mod["summary"]
  assert f"{decay}: early-strong/later-decaying in 4 of 4" in mod["summary"]
  assert f"{persist}: bounded persistent in 4 of 4" in mod["summary"]
  t = mod["settings"][0]["trajectory_attn"]
  assert t["early_steps"] == [0] and t["late_steps"] == [300]
  assert t["ratio"] == pytest.approx(1.0 if flip else 0.3 ** 3)
  verdicts = {(s["module"], s["format"]): s["verdict"] for s in ans["depth"]["settings"]}
  far, near = ("moe", "attn") if flip else ("attn", "moe")
  assert {verdicts[(far, f)] for f in ("e4m3", "e5m2")} == {"different"}
  assert {verdicts[(near, f)] for f in ("e4m3", "e5m2")} == {"close but not equal"}
  near_cmp = next(s["comparison"] for s in ans["depth"]["settings"]
                  if s["module"] == near and s["format"] == "e4m3")
  assert near_cmp["ratio"] == pytest.approx(1.05)
  assert near_cmp["steps_overlap"] == 4 and near_cmp["steps_excludes_null"] == 4
  assert "close but not equal in 2 of 2" in ans["depth"]["summary"]


def test_depth_verdict_thresholds():
  base = {"excludes_null": False, "steps_excludes_null": 0}
  assert questions.depth_verdict({**base, "ratio": 1.5}) == "different"
  assert questions.depth_verdict({**base, "ratio": 0.7}) == "different"
  assert questions.depth_verdict({**base, "ratio": 1.1}) == "close, not distinguishable"
  assert questions.depth_verdict({**base, "ratio": 1.1, "steps_excludes_null": 1}) == (
      "close but not equal")
  assert questions.depth_verdict({**base, "ratio": math.nan}) == "undetermined"


def test_redistribution_uses_migration_and_skips_nonfinite(res):
  policy = "attn_l0_e4m3"
  got = questions.redistribution(res, policy, k=3)
  series = [(s, {p: float(np.mean([per_param(policy, i, j)[p] for j in range(4)]))
                 for p in param_paths()}) for i, s in enumerate(STEPS)]
  want = ranking.migration(series, 3, [("attn_o", 0)], classifier=deepseek_paths.DEEPSEEK)
  assert [m["top"] for m in got["migration"]] == [m["top"] for m in want]
  for key in ("overlap_prev", "overlap_first", "spearman_first", "direct_share"):
    assert [m[key] for m in got["migration"]] == pytest.approx([m[key] for m in want])
  assert got["direct_topk_first"] == pytest.approx(1 / 3) and got["direct_topk_last"] == 0
  assert got["share_direct_first"] == pytest.approx(0.8)
  assert got["share_direct_last"] == pytest.approx(0.2)
  means = stats.mean_details(res, "moe_l0-8_e5m2", 100)
  assert max(means.values()) < 1e3  # the non-finite row's details are left out
  summary = questions.answers(res, top_k=3)["redistribution"]["summary"]
  # Layer 0 of the synthetic model is dense: moe_l0_* has no direct parameter to fade.
  assert "differ from those at the first in 6 of 8 policies" in summary
  assert "decreases from the first to the last checkpoint in 8 of 8 policies" in summary


@pytest.mark.parametrize("floor_moves", [True, False])
def test_redistribution_is_read_against_the_floors_own(tmp_path, floor_moves):
  """With floor details, the summary says whether the floor's top-k moves as much as the
  policies' on average (the migration is then the checkpoints') or less. The synthetic
  policies' top-3 overlaps, first vs last, are 2/3, 2/3, 0, 0, 1, 1, 0, 0."""
  folder = build(tmp_path / "sweep", floor=True)
  lines = [json.loads(x) for x in (folder / "details.jsonl").read_text().splitlines()]
  first = {(d["offset"], d["batch"]): d for d in lines
           if d["policy"] == "attn_l0-8_e4m3" and d["step"] == STEPS[0]}
  src = [d for d in lines if d["policy"] == "attn_l0-8_e4m3"]
  with open(folder / "details.jsonl", "a") as f:
    for d in src:  # the floor: attn_l0-8_e4m3's per-parameter norms, or step 0's at every step
      same = d if floor_moves else first[(d["offset"], d["batch"])]
      f.write(json.dumps({**d, "policy": "floor", "per_param": same["per_param"]}) + "\n")
  got = questions.redistribution_answer(results.load(folder), k=3)
  assert got["floor"]["available"]
  text = got["summary"]
  if floor_moves:
    assert got["floor"]["overlap_first_last"] == pytest.approx(
        got["policies"]["attn_l0-8_e4m3"]["overlap_first_last"])
    assert "noise floor's own top-3 (BF16 at perturbed weights) moves as much" in text
    assert "the migration is the checkpoints' own" in text
  else:
    assert got["floor"]["overlap_first_last"] == 1
    assert "moves less: overlap 1," in text and "checkpoints' own" not in text


def _is_png(path: pathlib.Path) -> bool:
  return path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_write_report_with_figures(sweep, tmp_path):
  path = sweep_report.write_report(sweep, out=tmp_path / "out", top_k=3)
  assert path == tmp_path / "out" / "report.md"
  text = path.read_text()
  for name in figures.NAMES:
    png = tmp_path / "out" / "figures" / f"{name}.png"
    assert _is_png(png), name
    assert f"(figures/{name}.png)" in text
  assert "| 100 | 8 | 0 | moe_l0-8_e5m2 | " + BAD_WHERE + " |" in text
  assert "abc1234-test" in text and "offsets [0, 8]" in text and "/runs/synthetic" in text
  for title in ("1. Module sensitivity", "2. Depth sensitivity", "3. Format sensitivity",
                "4. Perturbation redistribution"):
    assert f"## {title}" in text
  assert "E4M3 has lower rel_err than E5M2 in 4 of 4 settings" in text
  assert "nan" not in text.lower().replace("n/a", "")
  assert "[-" not in text  # no negative bound (the pooled t-intervals had them)
  assert "This sweep has no noise floor" in text  # a sweep in the format before floors
  assert "| attn_l0_e4m3 | policy |" in text
  assert not (sweep / "report.md").exists()


@pytest.mark.slow
@pytest.mark.parametrize("kw,unavailable", [
    ({"policies": ("attn_l0_e4m3",)}, 5),
    ({"policies": ("custom",), "steps": (0,), "offsets": (0,), "batches": 1}, 6)])
def test_small_grid_report(tmp_path, kw, unavailable):
  path = sweep_report.write_report(build(tmp_path / "s", **kw))
  text = path.read_text()
  assert text.count("Not available") == unavailable
  assert all(_is_png(path.parent / "figures" / f"{n}.png") for n in figures.NAMES)


@pytest.mark.slow
def test_binary_writes_report(sweep, tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  out = tmp_path / "bin"
  proc = subprocess.run([sys.executable, "-m", "fp8jax.experiments.report",
                         f"--results={sweep}", f"--out={out}", "--top_k=5"],
                        capture_output=True, text=True, env=env, cwd=REPO, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert (out / "report.md").exists() and "wrote" in proc.stdout
  check = ("import sys; from fp8jax.study import sweep_report; "
           "from fp8jax.study.comparison import figures, questions; "
           "from fp8jax.study.common import results, stats; "
           "assert 'matplotlib' not in sys.modules")
  proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                        env=env, cwd=REPO, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]


def test_nonfinite_baselines_are_a_data_problem_apart_from_nonfinite_fp8_rows(tmp_path):
  """A sweep of an earlier version wrote FP8 rows against a non-finite BF16 baseline: they
  are left out, and the report lists the baseline in its own section."""
  folder = build(tmp_path / "s")
  bad = {"step": 200, "offset": 0, "batch": 1}
  where = "grads/embed_tokens/embedding"

  def edit(name, change):
    items = [json.loads(x) for x in (folder / name).read_text().splitlines()]
    items = [change(x) if all(x[k] == v for k, v in bad.items()) else x for x in items]
    (folder / name).write_text("".join(json.dumps(x) + "\n" for x in items))

  edit("baseline.jsonl", lambda b: {**b, "finite": False, "nonfinite": where})
  edit("rows.jsonl", lambda r: {**r, "finite": False, "nonfinite": "bf16 " + where})
  res = results.load(folder)
  assert [(b["step"], b["offset"], b["batch"]) for b in res.baseline_nonfinite()] == [
      (200, 0, 1)]
  assert [r["policy"] for r in res.nonfinite()] == [BAD["policy"]]  # the FP8 one only
  assert len(res.rows) == len(SEED) * (len(STEPS) * len(OFFSETS) * BATCHES - 1)
  assert stats.stat(res, "rel_err", "attn_l0_e4m3", [200]).n_nonfinite == 0
  text = "\n".join(sweep_report.grid_markdown(res))
  fp8_part, base_part = text.split("## Non-finite BF16 baselines (data problem)")
  assert "| 100 | 8 | 0 | moe_l0-8_e5m2 | " + BAD_WHERE + " |" in fp8_part
  assert "bf16 " + where not in fp8_part
  assert f"| 200 | 0 | 1 | {where} |" in base_part


REFERENCE_NAMES = re.compile(r"(BF16|FP32) (reference|baseline|gradient|loss|pass)|g_(bf16|fp32)")
"""Where the report names the reference by a precision (a column name such as
``loss_bf16`` is no name of it)."""


@pytest.mark.parametrize("reference,label", [(None, "BF16"), ("bf16", "BF16"),
                                             ("fp32", "FP32")])
def test_the_report_names_the_reference_by_its_precision(tmp_path, reference, label):
  """A sweep of a model that computes in FP32 says FP32 wherever it names the reference;
  a folder that recorded no precision (written before the record) reads as BF16."""
  folder = build(tmp_path / "s", policies=SEED[:2], steps=(0, 100), floor=True,
                 reference=reference)
  edit = [json.loads(x) for x in (folder / "baseline.jsonl").read_text().splitlines()]
  edit[0].update(finite=False, nonfinite="grads/lm_head/kernel")  # its own section
  (folder / "baseline.jsonl").write_text("".join(json.dumps(x) + "\n" for x in edit))
  res = results.load(folder)
  assert res.reference == label
  text = sweep_report.render(res, questions.answers(res, top_k=3), {})
  named = {m.group(0) for m in REFERENCE_NAMES.finditer(text)}
  assert f"{label} reference" in named and f"## Non-finite {label} baselines" in text
  other = {"BF16": "FP32", "FP32": "BF16"}[label]
  assert not [n for n in named if other in n.upper()], named
  assert f"Reference: {label}, the model's own precision" in text
  assert ("predates the record" in text) == (reference is None)
