"""Fake-quant bandwidth benchmark: the payload path, the fused path and the Pallas kernel.

    python scripts/bench/fake_quant.py                 # bf16 [16384, 7168] on the default device
    python scripts/bench/fake_quant.py --rows 256 --cols 1024   # quick run (e.g. on CPU)
    python scripts/bench/fake_quant.py --sweep 8x8x4,16x8x8r,64x1x4fc  # other Pallas configs

Every timed function is jitted and timed after a warm-up as the median over ``--runs``
runs of ``--reps`` back-to-back calls (rotating among 3 input buffers, synchronised with
``block_until_ready`` at the end of each run). GB/s count the minimum traffic: one read
and one write of the bf16 tensor (4 bytes per element) for a forward, twice that for
forward + backward; "% copy" is relative to the faster of the two copy kernels.

Checks made on the device, reported in the JSON and before the table:

* payload path vs fused path vs Pallas kernel: elements that differ and the largest
  difference in bf16 ulps (FP32 scales divide, and GPU division is not correctly
  rounded, so differently fused kernels may disagree by an ulp of ``s``; power-of-two
  scales must agree exactly);
* ``round_to_format(x * s)`` vs the FP8 payload of ``quantize`` from the same scaled
  values (must be 0 differences), and an exhaustive sweep of all 2**32 float32 bit
  patterns ``round_to_format`` vs ``saturating_cast`` for the four formats;
* Pallas kernel configurations (``--block-rows`` and ``--sweep``: rows per program x
  tiles per program x num_warps, then suffixes: ``r`` for the reshape split, ``f`` for
  the flat split (rows = consecutive 1 x 128 tiles per program), ``c`` for
  ``rounding="cast"`` (hardware FP8 conversion instead of integer rounding)), each
  checked against the fused path on both inputs and for poison; they get a table of
  their own, printed last. The cast configurations come first in the default sweep (the
  bit-identity check on the device is the real test of the hardware cast). A
  configuration that fails to compile is reported and skipped; once the run has taken
  ``--max-seconds``, the remaining ones are skipped;
* poison: a NaN-filled buffer of the output's size is freed just before each kernel
  runs, so the allocator hands that memory out again; a NaN in the output (inputs are
  finite) means an element was never written.

With ``$OUT`` set, writes ``$OUT/fake_quant_bench.json`` and the optimised HLO of the
jitted functions (``$OUT/hlo_<name>.txt``) with their top-level fusion counts.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import re
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _fake_quant_checks import compare, core_rounding_mismatches, exhaustive_mismatches  # noqa: E402,E501
import _repo  # noqa: E402,F401
from _timing import count_nans, median_time, poisoned  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import fp8jax  # noqa: E402
from fp8jax.numerics import formats  # noqa: E402
from fp8jax.quant import fused_round_trip  # noqa: E402

# Cast rounding first (loop, reshape and flat splits, 4 and 8 warps), then the integer
# rounding's best shape of the last H100 run and two more integer ones for comparison.
_SWEEP = ("8x4x4c,8x8x4c,8x8x8c,16x8x8c,32x4x8c,8x8x4rc,16x8x8rc,"
          "32x1x4fc,64x1x4fc,128x1x8fc,256x1x8fc,"
          "8x4x4,64x1x4f,8x8x4r")
_SPLITS = {"": "loop", "r": "reshape", "f": "flat"}


def parse_configs(block_rows: str, num_warps, sweep: str):
  """Pallas configurations ``(block_rows, tiles_per_block, num_warps, split, rounding)``:
  one per ``--block-rows`` entry (one tile per program, integer rounding) then one per
  ``--sweep`` entry (``BMxTILESxWARPS`` then ``r`` (reshape split) or ``f`` (flat split)
  and ``c`` (cast rounding), e.g. ``16x8x8rc``), in order."""
  configs = [(int(v), 1, num_warps, "loop", "integer") for v in block_rows.split(",") if v]
  for item in (v.strip() for v in sweep.split(",")):
    if not item:
      continue
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)([rf]?)(c?)", item)
    if not m:
      raise ValueError(f"bad --sweep entry {item!r}: want BMxTILESxWARPS[r|f][c]")
    bm, tiles, warps = (int(m.group(i)) for i in (1, 2, 3))
    configs.append((bm, tiles, warps, _SPLITS[m.group(4)],
                    "cast" if m.group(5) else "integer"))
  return configs


def config_name(bm, tiles, warps, split, rounding):
  """``BMxTILESxWARPS[r|f][c]``, the --sweep syntax."""
  suffix = {v: k for k, v in _SPLITS.items()}[split] + ("c" if rounding == "cast" else "")
  return f"{bm}x{tiles}x{warps or '-'}{suffix}"


def _pallas():
  """The Pallas kernel module, or None when it cannot be imported."""
  try:
    from fp8jax.kernels import fake_quant_pallas
  except ImportError as e:  # pragma: no cover - depends on the install
    print(f"Pallas kernel unavailable: {e}")
    return None
  return fake_quant_pallas


def med_min(fn, args_list, runs, reps):
  """Median and min seconds per call (:func:`_timing.median_time`, 3 warm-up calls)."""
  med, times = median_time(fn, args_list, runs, calls=reps, warmup=3)
  return med, min(times)


# --- HLO --------------------------------------------------------------------------


def fusion_summary(hlo: str) -> dict:
  """Top-level (ENTRY) fusion and custom-call counts of an optimised HLO module."""
  entry = hlo[hlo.index("\nENTRY"):] if "\nENTRY" in hlo else hlo
  entry = entry[:entry.find("\n}") + 1] if "\n}" in entry else entry
  kinds: dict[str, int] = {}
  for line in entry.splitlines():
    if " fusion(" in line:
      m = re.search(r"kind=(k\w+)", line)
      kind = m.group(1) if m else "?"
      kinds[kind] = kinds.get(kind, 0) + 1
  return {"fusions": sum(kinds.values()), "fusion_kinds": kinds,
          "custom_calls": entry.count(" custom-call("),
          "has_fp8": bool(re.search(r"f8e\dm\d", hlo))}


# --- main -------------------------------------------------------------------------


def main():
  start = time.perf_counter()
  cpu = jax.default_backend() == "cpu"
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", type=int, default=256 if cpu else 16384)
  parser.add_argument("--cols", type=int, default=1024 if cpu else 7168)
  parser.add_argument("--runs", type=int, default=5 if cpu else 25)
  parser.add_argument("--reps", type=int, default=2 if cpu else 20)
  parser.add_argument("--block-rows", default="32",
                      help="Pallas rows per program, comma-separated (one tile per row, "
                      "integer rounding); '' for none")
  parser.add_argument("--num-warps", type=int, default=None,
                      help="Pallas num_warps of the --block-rows rows")
  parser.add_argument("--sweep", default=_SWEEP,
                      help="more Pallas configurations BMxTILESxWARPS[r|f][c], "
                      "comma-separated (r: reshape split, f: flat split, c: cast "
                      "rounding); '' for none")
  parser.add_argument("--max-seconds", type=float, default=75.0,
                      help="skip the remaining Pallas configurations after this long")
  parser.add_argument("--exhaustive-log2", type=int, default=20 if cpu else 32,
                      help="bit patterns 0 .. 2**N - 1 of the round_to_format sweep")
  parser.add_argument("--no-pallas", action="store_true")
  args = parser.parse_args()

  out_dir = os.environ.get("OUT")
  dev = jax.devices()[0]
  shape = (args.rows, args.cols)
  n = args.rows * args.cols
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, device {dev.device_kind}; "
        f"x bf16 {shape}, runs {args.runs} x reps {args.reps}", flush=True)
  spec = fp8jax.preset("deepseek_v3")  # E4M3 1x128, current scaling, FP32 scales
  spec_pow2 = fp8jax.preset("deepseek_v3_ue8m0")  # the same with pow2 (rceil) scales
  pallas = None if args.no_pallas else _pallas()
  interpret = cpu

  keys = jax.random.split(jax.random.key(0), 4)
  normal = [jax.random.normal(k, shape, jnp.bfloat16) for k in keys[:3]]

  @jax.jit
  def with_outliers(x, k):
    big = jax.random.uniform(k, x.shape) < 1e-3  # 0.1% of elements x 1000
    return jnp.where(big, x * 1000, x)

  outliers = [with_outliers(x, jax.random.fold_in(keys[3], i)) for i, x in enumerate(normal)]
  jax.block_until_ready(outliers)

  fns = {
      "copy (x.copy())": (jax.jit(lambda x: x.copy()), 4),
      "copy (x * 1)": (jax.jit(lambda x: x * 1), 4),
      "payload path quantize_dequantize": (
          jax.jit(lambda x: fp8jax.quantize_dequantize(x, spec)), 4),
      "fused quantize_dequantize_fused": (
          jax.jit(lambda x: fused_round_trip.quantize_dequantize_fused(x, spec)), 4),
      "fused, pow2 scales": (
          jax.jit(lambda x: fused_round_trip.quantize_dequantize_fused(x, spec_pow2)), 4),
      "fake_quant forward": (jax.jit(lambda x: fp8jax.fake_quant(x, spec)), 4),
  }

  def fwd_bwd(x, g):
    y, vjp = jax.vjp(lambda v: fp8jax.fake_quant(v, spec), x)
    return y, vjp(g)[0]

  def payload_fwd_bwd(x, g):  # what fake_quant computed before the fused path
    return fp8jax.quantize_dequantize(x, spec), fp8jax.quantize_dequantize(g, spec.backward)

  two_arg = {"fake_quant fwd+bwd (vjp)": jax.jit(fwd_bwd),
             "payload path fwd+bwd": jax.jit(payload_fwd_bwd)}
  pallas_fns = {}  # name -> jitted kernel, one per distinct effective configuration
  if pallas is not None:
    configs = parse_configs(args.block_rows, args.num_warps, args.sweep)
    for bm, tiles, warps, split, rounding in configs:
      bm, tiles = pallas.block_shape(shape, spec, bm, tiles, split)
      name = config_name(bm, tiles, warps, split, rounding)
      pallas_fns.setdefault(name, jax.jit(functools.partial(
          pallas.fake_quant_pallas, spec=spec, block_rows=bm, tiles_per_block=tiles,
          num_warps=warps, split=split, rounding=rounding, interpret=interpret)))

  results: dict = {"device": dev.device_kind, "backend": jax.default_backend(),
                   "jax": jax.__version__, "shape": list(shape), "dtype": "bfloat16",
                   "spec": spec.describe(), "runs": args.runs, "reps": args.reps,
                   "timings": {}, "checks": {}, "hlo": {}}

  # Correctness first: a wrong kernel's timing means nothing.
  checks = results["checks"]
  old_fn = fns["payload path quantize_dequantize"][0]
  fused_fn = fns["fused quantize_dequantize_fused"][0]
  old_pow2 = jax.jit(lambda x: fp8jax.quantize_dequantize(x, spec_pow2))
  for data_name, xs in (("normal", normal), ("outliers", outliers)):
    x = xs[0]
    old, fused = old_fn(x), fused_fn(x)
    checks[f"{data_name}: payload vs fused (fp32 scales) [n_diff, max_ulp]"] = compare(old, fused)
    checks[f"{data_name}: payload vs fused (pow2 scales) [n_diff, max_ulp]"] = compare(
        old_pow2(x), fns["fused, pow2 scales"][0](x))
    checks[f"{data_name}: fake_quant vs fused [n_diff, max_ulp]"] = compare(
        fns["fake_quant forward"][0](x), fused)
    checks[f"{data_name}: round_to_format vs payload, same x*s (fp32) n_diff"] = (
        core_rounding_mismatches(x, spec))
    checks[f"{data_name}: round_to_format vs payload, same x*s (pow2) n_diff"] = (
        core_rounding_mismatches(x, spec_pow2))
    if pallas is not None:
      for rounding in pallas.ROUNDINGS:
        pf = jax.jit(functools.partial(pallas.fake_quant_pallas, spec=spec_pow2,
                                       rounding=rounding, interpret=interpret))
        try:
          checks[f"{data_name}: pallas {rounding} (pow2 scales) vs payload [n_diff, max_ulp]"] = (
              compare(pf(x), old_pow2(x)))
        except Exception as e:  # noqa: BLE001 - reported, the sweep reports it again
          checks[f"{data_name}: pallas {rounding} (pow2 scales)"] = (
              f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
  for name in ("fused quantize_dequantize_fused", "fake_quant forward"):
    checks[f"poison: NaNs in output of {name}"] = count_nans(poisoned(fns[name][0], outliers[1]))
  checks["poison: NaNs in output of fake_quant fwd+bwd"] = count_nans(poisoned(
      two_arg["fake_quant fwd+bwd (vjp)"], outliers[1], outliers[2]))
  t0 = time.perf_counter()
  for fmt_name in formats.FORMATS:
    checks[f"exhaustive 2**{args.exhaustive_log2} bit patterns {fmt_name}: n_diff"] = (
        exhaustive_mismatches(fmt_name, args.exhaustive_log2))
  checks["exhaustive sweep seconds"] = round(time.perf_counter() - t0, 1)
  for k, v in checks.items():
    print(f"check  {k}: {v}", flush=True)

  # HLO structure.
  x0 = normal[0]
  hlo_targets = {"payload_path": (old_fn, (x0,)), "fused": (fused_fn, (x0,)),
                 "fake_quant_fwd": (fns["fake_quant forward"][0], (x0,)),
                 "fake_quant_fwd_bwd": (two_arg["fake_quant fwd+bwd (vjp)"], (x0, normal[1])),
                 "payload_fwd_bwd": (two_arg["payload path fwd+bwd"], (x0, normal[1])),
                 "copy": (fns["copy (x.copy())"][0], (x0,))}
  for name, (f, fargs) in hlo_targets.items():
    text = f.lower(*fargs).compile().as_text()
    results["hlo"][name] = fusion_summary(text)
    if out_dir:
      pathlib.Path(out_dir, f"hlo_{name}.txt").write_text(text)
    print(f"hlo    {name}: {results['hlo'][name]}", flush=True)

  # Timings.
  rows = []
  for data_name, xs in (("normal", normal), ("outliers", outliers)):
    for name, (f, bytes_per_elt) in fns.items():
      if data_name == "outliers" and name.startswith("copy"):
        continue
      med, best = med_min(f, [(x,) for x in xs], args.runs, args.reps)
      rows.append((data_name, name, med, best, bytes_per_elt))
    for name, f in two_arg.items():
      pairs = [(xs[i], xs[(i + 1) % 3]) for i in range(3)]
      med, best = med_min(f, pairs, args.runs, args.reps)
      rows.append((data_name, name, med, best, 8))
  copy_gbps = max(4 * n / med / 1e9 for d, name, med, _, _ in rows if name.startswith("copy"))
  for data_name, name, med, best, bpe in rows:
    gbps = bpe * n / med / 1e9
    results["timings"][f"{data_name}/{name}"] = {
        "ms_median": med * 1e3, "ms_min": best * 1e3, "bytes_per_element": bpe,
        "gbps": gbps, "pct_of_copy": 100 * gbps / copy_gbps}
  results["copy_gbps"] = copy_gbps

  # Pallas configurations: checks, then timings on both inputs.
  sweep_rows = []  # (name, status, ms med normal, ms min normal, ms med outliers, diff, nans)
  results["pallas"] = {}
  for name, f in pallas_fns.items():
    entry = results["pallas"][name] = {}
    if time.perf_counter() - start > args.max_seconds:
      entry["status"] = "skipped (time)"
      sweep_rows.append((name, entry["status"], None, None, None, None, None))
      continue
    try:
      diffs = {}
      for data_name, xs in (("normal", normal), ("outliers", outliers)):
        y = f(xs[0])
        diffs[data_name] = compare(y, fused_fn(xs[0]))
        entry[f"{data_name} vs fused [n_diff, max_ulp]"] = diffs[data_name]
        entry[f"{data_name} vs payload [n_diff, max_ulp]"] = compare(y, old_fn(xs[0]))
        del y
    except Exception as e:  # noqa: BLE001 - a configuration that does not compile
      entry["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
      sweep_rows.append((name, entry["status"], None, None, None, None, None))
      continue
    entry["status"] = "ok"
    entry["poison NaNs"] = count_nans(poisoned(f, outliers[1]))
    times = {d: med_min(f, [(x,) for x in xs], args.runs, args.reps)
             for d, xs in (("normal", normal), ("outliers", outliers))}
    for d, (med, best) in times.items():
      entry[f"{d} ms_median"], entry[f"{d} ms_min"] = med * 1e3, best * 1e3
      entry[f"{d} pct_of_copy"] = 100 * 4 * n / med / 1e9 / copy_gbps
    diff = (diffs["normal"][0] + diffs["outliers"][0],
            max(diffs["normal"][1], diffs["outliers"][1]))
    sweep_rows.append((name, "ok", times["normal"][0], times["normal"][1],
                       times["outliers"][0], diff, entry["poison NaNs"]))
  if pallas_fns and not interpret:
    ok = [k for k, v in results["pallas"].items() if v["status"] == "ok"]
    if ok:
      best = min(ok, key=lambda k: results["pallas"][k]["normal ms_median"])
      text = pallas_fns[best].lower(x0).compile().as_text()
      results["hlo"]["pallas"] = fusion_summary(text)
      if out_dir:
        pathlib.Path(out_dir, "hlo_pallas.txt").write_text(text)
  results["total_seconds"] = round(time.perf_counter() - start, 1)

  if out_dir:
    pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
    pathlib.Path(out_dir, "fake_quant_bench.json").write_text(json.dumps(results, indent=1))

  print(f"\n{dev.device_kind}, x bf16 {shape}, {spec.describe()}; copy bandwidth "
        f"{copy_gbps:.0f} GB/s (4 B/element = 100%); whole run {results['total_seconds']} s")
  print(f"{'data':9} {'function':36} {'ms med':>8} {'ms min':>8} {'B/el':>5} {'GB/s':>8} "
        f"{'% copy':>7}")
  for data_name, name, med, best, bpe in rows:
    gbps = bpe * n / med / 1e9
    print(f"{data_name:9} {name:36} {med * 1e3:8.4f} {best * 1e3:8.4f} {bpe:5d} "
          f"{gbps:8.1f} {100 * gbps / copy_gbps:7.1f}")
  if sweep_rows:
    print(f"\nPallas BMxTILESxWARPS (rows x 1x{pallas.tile_size(spec)} tiles per program, "
          f"r: reshape split, f: flat split, c: cast rounding); diff = outputs vs fused on "
          f"both inputs [n_diff, max_ulp]")
    print(f"{'config':10} {'ms med':>8} {'ms min':>8} {'GB/s':>8} {'% copy':>7} "
          f"{'outl ms':>8} {'diff':>10} {'NaNs':>5}")
  for name, status, med, best, med_out, diff, nans in sweep_rows:
    if status != "ok":
      print(f"{name:10} {status}")
      continue
    gbps = 4 * n / med / 1e9
    print(f"{name:10} {med * 1e3:8.4f} {best * 1e3:8.4f} {gbps:8.1f} "
          f"{100 * gbps / copy_gbps:7.1f} {med_out * 1e3:8.4f} {str(list(diff)):>10} {nans:5d}")


if __name__ == "__main__":
  main()
