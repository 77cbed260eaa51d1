"""The one-pass quantization of a grouped GEMM's rows for both of their GEMMs.

    python scripts/bench/tile_quant.py [--out=FILE.json] [--tokens=16384]

At the 2B expert shapes (``_moe_problem.py``: 16384 tokens x top 7, d 1280, f 896, 63
experts, groups padded to 128 rows) X [N, 1280] and dY [N, 896] (bf16) are quantized as
``gemm:fp32_blockwise`` needs them (E4M3, 1 x 128 tiles along each GEMM's contraction):

* ``one_pass``: :func:`fp8jax.kernels.tile_quant_pallas.quantize_rows_and_columns` (num_warps
  2, 4 and 8), against XLA: ``qtensor.quantize`` for the rows plus
  ``transpose.quantize_columns`` (rows first, what the Wgrad used) or
  ``transpose.quantize_swapped`` (transposed);
* ``same_bits``: the kernel's payloads and scales against XLA's, on the benchmark rows and on
  rows whose magnitudes span 2^-60..2^60 with NaN and inf in some blocks;
* ``wgrad``: per GEMM, the quantizations plus Wgrad as each path runs them (old: four XLA
  quantizations and the rows-first kernel; new: two one-pass kernels and the transposed
  kernel, with bf16 and with FP8 dots);
* ``copy``: ``a + 1`` on X (bf16 read and write), the bandwidth a pass over the rows gets.

Medians of 20 runs (``_timing.median_time``). On a CPU, a small interpreted problem.
"""

import argparse
import json

from _moe_problem import padded_problem
import _repo  # noqa: F401
from _results import RESULTS, record
from _timing import median_time
import jax
import jax.numpy as jnp
import numpy as np

import fp8jax
from fp8jax.gemm import transpose
from fp8jax.kernels import grouped_scaled_pallas as gsp
from fp8jax.kernels import tile_quant_pallas as tq
from fp8jax.quant import qtensor


def _wide(shape, seed):
  """bf16 rows whose magnitudes span 2^-60..2^60 by row and column, NaN and inf in a few."""
  rng = np.random.default_rng(seed)
  v = rng.standard_normal(shape) * np.exp2(rng.uniform(-30, 30, (shape[0], 1)))
  v *= np.exp2(rng.uniform(-30, 30, (1, shape[1])))
  v.flat[rng.integers(0, v.size, 8)] = [np.nan, np.inf, -np.inf, 0, np.nan, 1e30, -1e-30, 5]
  return jnp.asarray(v, jnp.bfloat16)


def _same(a, b) -> bool:
  a, b = np.asarray(a), np.asarray(b)
  nan = np.isnan(a.astype(np.float32))
  if not np.array_equal(nan, np.isnan(b.astype(np.float32))):
    return False
  width = {1: np.uint8, 4: np.uint32}[a.dtype.itemsize]
  return bool(np.array_equal(a.view(width)[~nan], b.view(width)[~nan]))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default="")
  ap.add_argument("--tokens", type=int, default=16384)
  args = ap.parse_args()
  interpret = jax.default_backend() != "gpu"
  runs = 3 if interpret else 20
  x, dy, _, padded, _ = padded_problem(args.tokens, not interpret)
  spec = fp8jax.recipe("fp32_blockwise").roles.input
  RESULTS["device"] = jax.devices()[0].device_kind
  RESULTS["rows"] = int(x.shape[0])

  def one_pass(warps):
    return jax.jit(lambda a: tq.quantize_rows_and_columns(a, spec, num_warps=warps,
                                                          interpret=interpret))

  xla = {"rows_and_columns": jax.jit(lambda a: (qtensor.quantize(a, spec),
                                                transpose.quantize_columns(a, spec))),
         "rows_and_transposed": jax.jit(lambda a: (qtensor.quantize(a, spec),
                                                   transpose.quantize_swapped(a, spec)))}
  for name, v in (("x", x), ("dy", dy)):
    mb = v.size * 4 / 1e6  # bf16 read, two 8-bit payloads written
    for warps in (2, 4, 8):
      t, times = median_time(one_pass(warps), [(v,)], runs)
      record(f"one_pass_{name}_w{warps}", ms=t * 1e3, gb_s=mb / t / 1e3, times=times)
    for path, fn in xla.items():
      t, times = median_time(fn, [(v,)], runs)
      record(f"xla_{path}_{name}", ms=t * 1e3, times=times)
    for label, rows in (("bench", v), ("wide", _wide(v.shape, 1))):
      (q, s, qt, st), (r0, c0) = one_pass(4)(rows), xla["rows_and_transposed"](rows)
      record(f"same_bits_{name}_{label}", rows_payload=_same(q, r0.data),
             rows_scales=_same(s, r0.scale_inv), transposed_payload=_same(qt, c0.data),
             transposed_scales=_same(st.T, c0.scale_inv),
             nan_blocks=int(np.isnan(np.asarray(s)).sum()))
  t, times = median_time(jax.jit(lambda a: a + 1), [(x,)], runs)
  record("copy_x", ms=t * 1e3, gb_s=x.size * 4 / t / 1e9, times=times)

  def wgrad(a, sa, b, sb, rows_first, fp8_dots=False):
    return gsp.grouped_scaled_wgrad(a, sa, b, sb, padded, groups_aligned=True,
                                    rows_first=rows_first, convert_in_kernel=True,
                                    fp8_dots=fp8_dots, interpret=interpret)

  def old(a, b):
    (ra, ca), (rb, cb) = xla["rows_and_columns"](a), xla["rows_and_columns"](b)
    return ra, rb, wgrad(ca.data, ca.scale_inv, cb.data, cb.scale_inv, True)

  def new(a, b, fp8_dots):
    qa, sa, qta, sta = tq.quantize_rows_and_columns(a, spec, interpret=interpret)
    qb, sb, qtb, stb = tq.quantize_rows_and_columns(b, spec, interpret=interpret)
    return (qa, sa), (qb, sb), wgrad(qta, sta.T, qtb, stb.T, False, fp8_dots)

  dws = {}
  for name, fn in (("old_rows_first", old), ("new_bf16_dots", lambda a, b: new(a, b, False)),
                   ("new_fp8_dots", lambda a, b: new(a, b, True))):
    fn = jax.jit(fn)
    dws[name] = np.asarray(fn(x, dy)[2])
    t, times = median_time(fn, [(x, dy)], runs)
    record(f"wgrad_{name}", ms=t * 1e3, times=times)
  base = dws["old_rows_first"]
  for name in ("new_bf16_dots", "new_fp8_dots"):
    d = dws[name]
    record(f"dw_{name}_vs_old", equal_fraction=float(np.mean(d == base)),
           rel_diff=float(np.linalg.norm(d - base) / np.linalg.norm(base)))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(RESULTS, f, indent=1)


if __name__ == "__main__":
  main()
