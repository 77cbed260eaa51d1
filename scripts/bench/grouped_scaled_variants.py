"""Where the grouped blockwise-scaled Fprop kernel loses its time: a sweep of variants.

    python scripts/bench/grouped_scaled_variants.py [variants,library,tc,mma]   # GPU, ~2 min

The 2B gate GEMM's Fprop (``_moe_problem``: 16384 tokens x top 7, d 1280, f 896, 63
experts, Zipf loads), with every group padded to whole 128-row tiles as
``gemm:fp32_blockwise`` lays its rows out. Each variant is a copy of
``grouped_scaled_pallas._rows_kernel`` as it was before 2026-11-26 (128 x 128 x 128
tiles, 8 warps, 3 stages), reduced to aligned groups and whole column blocks (tiles whose
``n`` does not divide F are skipped), with one thing changed:

* ``ops``: ``bf16`` (payloads converted by XLA before the kernel), ``cvt`` (8-bit
  payloads converted in the kernel: the library's default) or ``fp8`` (FP8 x FP8 tensor-core
  dots: each MMA instruction's sum formed by the tensor core, so not the exact float32
  sums; ``grouped_scaled_pallas`` offers it as ``fp8_dots``);
* ``promote``: ``interval`` (``acc += dot * sa * sb`` every 128 of K, the recipe) or
  ``end`` (``acc += dot``, no scales: a bound, wrong numbers);
* ``masks``: row masks on every load (as the library had them) or none (aligned groups);
* ``sb``: the weight scale per column (as the library had it) or one scalar per 128 x 128 block;
* ``order``: ``rows`` (row tiles vary fastest over the programs, as in the library) or
  ``cols`` (the column blocks of one row tile run side by side and share its rows in L2).

Reported: median ms per call (``_timing.median_time``, 20 runs of 5 calls), TFLOP/s, and
each variant's largest difference from the library kernel as it is now (bf16 outputs; 0
expected where the numerics are the recipe's), with the library kernel and the BF16
grouped GEMM (``grouped_gpu``) timed in the same process. Part ``library``: the library
kernel per tile, masked and aligned, Fprop and Dgrad; part ``tc``: FP8 dots against the
FP32 kernel and the tensor-core model, float32 outputs, 2048 tokens; part ``mma``: the
library kernels with FP8 dots per tile, Fprop, Dgrad and Wgrad (transposed operands).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _moe_problem import padded_problem  # noqa: E402
from _results import RESULTS, record  # noqa: E402
from _timing import median_time  # noqa: E402
import jax  # noqa: E402
from jax import lax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from fp8jax.gemm import accumulate, grouped_tensor_core  # noqa: E402
from fp8jax.kernels import grouped_gpu, tile_quant_pallas  # noqa: E402
from fp8jax.kernels import grouped_matmul_triton as gmp  # noqa: E402
from fp8jax.kernels import grouped_scaled_pallas as gsp  # noqa: E402
from fp8jax.numerics import roles as roles_lib  # noqa: E402
from fp8jax.quant import qtensor  # noqa: E402

ROLES = roles_lib.deepseek_v3_roles()


@dataclasses.dataclass(frozen=True)
class Variant:
  ops: str = "cvt"
  promote: str = "interval"
  masks: bool = True
  sb: str = "column"
  order: str = "rows"
  blocks: gsp.Blocks = gsp.Blocks(128, 128, 128, 8, 3)  # the library's tile until 2026-11-26

  @property
  def tag(self) -> str:
    b = self.blocks
    return (f"{self.ops}_{self.promote}_{'masks' if self.masks else 'nomask'}_sb{self.sb}_"
            f"{self.order}_{b.m}x{b.n}x{b.k}w{b.num_warps}s{b.num_stages}")


def _kernel(group_ref, start_ref, end_ref, a_ref, sa_ref, b_ref, sb_ref, o_ref, *,
            v: Variant, n_int: int):
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plgpu

  ax_t, ax_c = (0, 1) if v.order == "rows" else (1, 0)
  t, c = pl.program_id(ax_t), pl.program_id(ax_c)
  g, start, end = group_ref[t], start_ref[t], end_ref[t]
  bm, bn, bk = v.blocks.m, v.blocks.n, v.blocks.k
  e = b_ref.shape[0]
  row_ok = (start + lax.broadcasted_iota(jnp.int32, (bm, 1), 0) < end) if v.masks else None
  row_ok1 = (start + lax.broadcasted_iota(jnp.int32, (bm,), 0) < end) if v.masks else None

  def step(jj, acc):
    part = None
    for i in range(128 // bk):
      k0 = pl.multiple_of(jj * 128 + i * bk, bk)
      x = gsp._load(a_ref.at[pl.ds(start, bm), pl.ds(k0, bk)], row_ok)
      y = gsp._load(b_ref.at[g, pl.ds(c * bn, bn), pl.ds(k0, bk)], None)
      if v.ops == "cvt":
        x, y = x.astype(jnp.bfloat16), y.astype(jnp.bfloat16)
      if v.promote == "end":
        acc = acc + lax.dot_general(x, y, (((1,), (1,)), ((), ())),
                                    preferred_element_type=jnp.float32)
        continue
      prod = lax.dot_general(x, y, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
      part = prod if part is None else part + prod
    if v.promote == "end":
      return acc
    sa = gsp._load(sa_ref.at[pl.ds(start, bm), jj], row_ok1)
    if v.sb == "column":
      return acc + part * (sa[:, None] * sb_ref[g, jj, pl.ds(c * bn, bn)][None, :])
    return acc + part * (sa * sb_ref[g, c, jj])[:, None]

  def store(acc):
    plgpu.store(o_ref.at[pl.ds(start, bm), pl.ds(c * bn, bn)], acc.astype(o_ref.dtype),
                mask=row_ok)

  @pl.when((end > start) & (g < e))
  def _():
    store(lax.fori_loop(0, n_int, step, jnp.zeros((bm, bn), jnp.float32)))

  @pl.when((end > start) & (g == e))
  def _():
    store(jnp.zeros((bm, bn), jnp.float32))


def run_variant(v: Variant, a, sa, b, sb_block, sizes, interpret=False,
                out_dtype=jnp.bfloat16):
  """a [N, K] fp8 rows (groups padded to 128), sa [N, J], b [E, F, K] fp8, sb_block
  [E, F/128, J]; F a multiple of blocks.n."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plgpu

  n, k = a.shape
  f = b.shape[1]
  n_int = k // 128
  if v.ops == "bf16":
    a, b = (lax.optimization_barrier(t).astype(jnp.bfloat16) for t in (a, b))
  sb = sb_block
  if v.sb == "column":
    sb = jnp.repeat(jnp.swapaxes(sb_block, 1, 2), 128, axis=2)  # [E, J, F]
  group, start, end = gmp.row_tiles(sizes, n, v.blocks.m)
  grid = (group.shape[0], f // v.blocks.n)
  if v.order == "cols":
    grid = grid[::-1]
  return pl.pallas_call(
      functools.partial(_kernel, v=v, n_int=n_int),
      out_shape=jax.ShapeDtypeStruct((n, f), out_dtype), grid=grid,
      compiler_params=None if interpret else plgpu.CompilerParams(
          num_warps=v.blocks.num_warps, num_stages=v.blocks.num_stages),
      interpret=interpret, name="variant")(group, start, end, a, sa, b, sb)


def variants() -> list[Variant]:
  base = Variant()
  out = [base,
         dataclasses.replace(base, ops="bf16"),
         dataclasses.replace(base, promote="end"),
         dataclasses.replace(base, ops="bf16", promote="end"),
         dataclasses.replace(base, masks=False),
         dataclasses.replace(base, sb="block"),
         dataclasses.replace(base, order="cols"),
         dataclasses.replace(base, ops="fp8"),
         dataclasses.replace(base, ops="fp8", promote="end")]
  lean = dataclasses.replace(base, masks=False, sb="block", order="cols")
  out += [lean, dataclasses.replace(lean, ops="fp8")]
  for blocks in (gsp.Blocks(64, 128, 128, 4, 4), gsp.Blocks(128, 128, 128, 4, 3),
                 gsp.Blocks(128, 128, 64, 8, 4), gsp.Blocks(128, 256, 64, 8, 3),
                 gsp.Blocks(64, 256, 128, 8, 3)):
    wide = dataclasses.replace(lean, blocks=blocks,
                               sb="block" if blocks.n == 128 else "column")
    out += [wide, dataclasses.replace(wide, ops="fp8")]
  return out


def _operands(rows, w_t):
  """Quantized rows [N, K] (1 x 128 tiles) and weights [E, F, K] (128 x 128 blocks)."""
  rq = jax.jit(lambda t: qtensor.quantize(t, ROLES.input))(rows)
  wq = jax.jit(jax.vmap(lambda m: qtensor.quantize(m, ROLES.weight)))(w_t)
  return rq, wq


def _library(blocks, aligned, interpret, out_dtype=jnp.bfloat16):
  return jax.jit(lambda a, sa, b, sb, s: gsp.grouped_scaled_matmul(
      a, sa, b, sb, s, transpose_b=True, out_dtype=out_dtype, blocks=blocks,
      groups_aligned=aligned, convert_in_kernel=True, interpret=interpret))


def part_variants(gpu: bool):
  x, _, gate, padded, flop = padded_problem(16384, gpu)
  xq, wq = _operands(x, jnp.swapaxes(gate, 1, 2))
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}: N {x.shape[0]} (padded), "
        f"K {x.shape[1]}, F {gate.shape[2]}, E {gate.shape[0]}", flush=True)
  args = (xq.data, xq.scale_inv, wq.data, wq.scale_inv, padded)
  lib = _library(gsp.ROWS, False, not gpu)
  want = lib(*args)
  _time("library", lib, args, flop)
  if gpu:
    bf16 = jax.jit(lambda a, w, s: grouped_gpu.grouped_matmul(a, w, s))
    _time("bf16_grouped_gemm", bf16, (x, gate, padded), flop)
  diff = jax.jit(lambda a, b: jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
  for v in variants() if gpu else variants()[:7]:  # FP8 dots need a GPU
    if gate.shape[2] % v.blocks.n:
      record(v.tag, skipped=f"F {gate.shape[2]} is not a multiple of the tile's n")
      continue
    fn = jax.jit(functools.partial(run_variant, v, interpret=not gpu))
    try:
      d = float(diff(fn(*args), want))
    except Exception as err:  # noqa: BLE001 - a variant that fails to compile
      record(v.tag, error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
      continue
    _time(v.tag, fn, args, flop, max_abs_diff_vs_library=d)


LIBRARY_BLOCKS = (gsp.Blocks(128, 128, 128, 8, 3), gsp.Blocks(64, 128, 128, 4, 4),
                  gsp.Blocks(64, 128, 128, 4, 3), gsp.Blocks(128, 128, 128, 4, 3),
                  gsp.Blocks(64, 128, 64, 4, 4))


def part_library(gpu: bool):
  """The library kernel, Fprop and Dgrad, masked against aligned, per tile."""
  x, dy, gate, padded, flop = padded_problem(16384, gpu)
  for name, rows, w_t in (("fprop", x, jnp.swapaxes(gate, 1, 2)), ("dgrad", dy, gate)):
    rq, wq = _operands(rows, w_t)
    args = (rq.data, rq.scale_inv, wq.data, wq.scale_inv, padded)
    want = None
    for blocks in LIBRARY_BLOCKS if gpu else LIBRARY_BLOCKS[:1]:
      for aligned in (False, True):
        fn = _library(blocks if gpu else gsp.Blocks(32, 32, 32), aligned, not gpu)
        out = fn(*args)
        want = out if want is None else want
        b = blocks
        _time(f"lib_{name}_{'aligned' if aligned else 'masked'}_{b.m}x{b.n}x{b.k}w"
              f"{b.num_warps}s{b.num_stages}", fn, args, flop,
              same_bits_as_first=bool(jnp.all(out == want)))


MMA_ROWS = (gsp.ROWS, gsp.Blocks(128, 128, 128, 8, 3), gsp.Blocks(128, 128, 128, 4, 4),
            gsp.Blocks(64, 128, 128, 4, 3), gsp.Blocks(128, 256, 128, 8, 3),
            gsp.Blocks(64, 256, 128, 8, 3), gsp.Blocks(64, 64, 128, 4, 4))
MMA_WGRAD = (gsp.WGRAD, gsp.Blocks(128, 128, 128, 4, 4), gsp.Blocks(64, 128, 128, 4, 4),
             gsp.Blocks(128, 256, 128, 8, 3), gsp.Blocks(256, 128, 128, 8, 3),
             gsp.Blocks(128, 128, 64, 4, 4))


def _tag(b: gsp.Blocks) -> str:
  return f"{b.m}x{b.n}x{b.k}w{b.num_warps}s{b.num_stages}"


def _time_or_error(name, fn, args, flop, first: list):
  """Times ``fn`` and records whether its output has the bits of the first tile's."""
  try:
    out = fn(*args)
    if not first:
      first.append(out)
    _time(name, fn, args, flop, same_bits_as_first=bool(jnp.all(out == first[0])))
  except Exception as err:  # noqa: BLE001 - a tile that fails to compile
    record(name, error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")


def part_mma(gpu: bool):
  """FP8 dots (``fp8_dots``; ``GemmConfig.fp8_mma``) per tile: Fprop and Dgrad on aligned
  groups, and Wgrad on the transposed operands of the one-pass quantization."""
  x, dy, gate, padded, flop = padded_problem(16384, gpu)
  small = (gsp.Blocks(32, 32, 32),)
  for name, rows, w_t in (("fprop", x, jnp.swapaxes(gate, 1, 2)), ("dgrad", dy, gate)):
    rq, wq = _operands(rows, w_t)
    args = (rq.data, rq.scale_inv, wq.data, wq.scale_inv, padded)
    first = []
    for blocks in MMA_ROWS if gpu else small:
      fn = jax.jit(lambda a, sa, b, sb, s, blocks=blocks: gsp.grouped_scaled_matmul(
          a, sa, b, sb, s, transpose_b=True, out_dtype=jnp.bfloat16, blocks=blocks,
          groups_aligned=True, convert_in_kernel=True, fp8_dots=True, interpret=not gpu))
      _time_or_error(f"mma_{name}_{_tag(blocks)}", fn, args, flop, first)
  both = jax.jit(lambda v: tile_quant_pallas.quantize_rows_and_columns(
      v, ROLES.input, interpret=not gpu))
  (*_, xt, sxt), (*_, dyt, sdyt) = both(x), both(dy)
  args = (xt, sxt.T, dyt, sdyt.T, padded)
  first = []
  for blocks in MMA_WGRAD if gpu else small:
    fn = jax.jit(lambda a, sa, b, sb, s, blocks=blocks: gsp.grouped_scaled_wgrad(
        a, sa, b, sb, s, groups_aligned=True, blocks=blocks, convert_in_kernel=True,
        fp8_dots=True, interpret=not gpu))
    _time_or_error(f"mma_wgrad_{_tag(blocks)}", fn, args, flop, first)


def part_tensor_core(gpu: bool):
  """FP8 x FP8 tensor-core dots per interval of 128 (the hardware's accumulator) against
  the tensor-core model (``grouped_tensor_core.rows_product``, ``accumulate.HOPPER``)
  and against the FP32-accumulation kernel, float32 outputs, on a smaller problem."""
  if not gpu:
    return
  x, _, gate, padded, _ = padded_problem(2048, gpu)
  xq, wq = _operands(x, jnp.swapaxes(gate, 1, 2))
  args = (xq.data, xq.scale_inv, wq.data, wq.scale_inv, padded)
  lean = Variant(ops="fp8", masks=False, sb="block", order="cols")
  hw = jax.jit(functools.partial(run_variant, lean, out_dtype=jnp.float32))(*args)
  model = jax.jit(lambda a, b, s: grouped_tensor_core.rows_product(a, b, s, accumulate.HOPPER)
                  )(xq, wq, padded)
  fp32 = _library(gsp.ROWS, True, False, jnp.float32)(*args)
  real = jnp.arange(x.shape[0]) < jnp.sum(padded)
  for name, a, b in (("hw_vs_model", hw, model), ("hw_vs_fp32", hw, fp32),
                     ("model_vs_fp32", model, fp32)):
    a, b = a[real], b[real]
    record(f"tc_{name}", equal_fraction=float(jnp.mean(a == b)),
           rel_norm=float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)),
           max_rel=float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))))


def main():
  gpu = jax.default_backend() == "gpu"  # elsewhere: small problems, interpreted
  parts = sys.argv[1].split(",") if len(sys.argv) > 1 else ["variants", "library", "tc"]
  for part in parts:
    {"variants": part_variants, "library": part_library, "tc": part_tensor_core,
     "mma": part_mma}[part](gpu)
  if os.environ.get("OUT"):
    path = pathlib.Path(os.environ["OUT"]) / "grouped_scaled_variants.json"
    path.write_text(json.dumps({"device": jax.devices()[0].device_kind,
                                "jax": jax.__version__, "results": RESULTS}, indent=1))


def _time(name, fn, args, flop, **extra):
  gpu = jax.default_backend() == "gpu"
  t, ts = median_time(fn, [args], 20 if gpu else 1, calls=5 if gpu else 1,
                      warmup=2 if gpu else 0)
  record(name, ms=t * 1e3, tflops=flop / t / 1e12, times=ts, **extra)


if __name__ == "__main__":
  main()
