"""Each expert weight quantized in one read, with its operand telemetry.

    python scripts/bench/block_quant.py [--out=FILE.json]

The three routed-expert weights of one 2B MoE layer (float32 parameters: gate and up [63,
1280, 896], down [63, 896, 1280]) quantized as ``gemm:fp32_blockwise`` needs them (E4M3,
128 x 128 blocks, each expert a tensor of its own, from the bfloat16 weights the model
computes with):

* ``xla_once``: XLA's ``qtensor.quantize`` of each ``w.astype(bf16)`` (what
  ``grouped_operands.weight_quantized_once`` ran before the kernel);
* ``xla_telemetry``: ``operand_telemetry.expert_sums`` of each W^T (the telemetry before);
* ``xla_both``: the two in one function (what the recipe pair's variant pass ran);
* ``kernel``: :func:`fp8jax.kernels.block_quant_pallas.quantize_blocks` of the float32
  parameters with ``in_dtype=bf16`` (num_warps 4 and 8), with its per-block statistics
  (``kernel_stats``) and ``with_stats`` plus the telemetry sums
  (``grouped_operands.weights_once``);
* ``same_bits_*``: the payloads and scales against XLA's quantization of the bfloat16
  weights materialized first (on the benchmark weights and on weights spanning
  2^-60..2^60 with NaN and inf blocks): the kernel's from the float32 parameters
  (``kernel``) and from the bfloat16 weights (``kernel_of_bf16``), and ``xla_once``'s,
  whose cast in the same function XLA may skip (``--xla_allow_excess_precision``, its
  default); the telemetry's counts and histogram (``counts``) and float32 sums
  (``max_rel_sum``) against ``xla_telemetry`` of the materialized weights;
* ``copy``: ``w + 1`` on the float32 weights (read and write), a pass's bandwidth.

Medians of 20 runs (``_timing.median_time``). On a CPU, a small interpreted problem.
"""

import argparse
import json

import _repo  # noqa: F401
from _results import RESULTS, record
from _timing import median_time
import jax
import jax.numpy as jnp
import numpy as np

import fp8jax
from fp8jax.gemm import grouped_operands, operand_telemetry
from fp8jax.kernels import block_quant_pallas as bq
from fp8jax.quant import qtensor


def _weights(gpu: bool, key):
  e, d, f = (63, 1280, 896) if gpu else (2, 256, 128)
  shapes = ((e, d, f), (e, d, f), (e, f, d))
  keys = jax.random.split(key, 3)
  return [jax.random.normal(k, s, jnp.float32) * 0.006 for k, s in zip(keys, shapes)]


def _wide(w):
  """``w`` with magnitudes from 2^-60 to 2^60 by block row, NaN and inf in some blocks."""
  scale = jnp.exp2(jnp.linspace(-60, 60, w.shape[1]))[None, :, None]
  return (w * scale).at[0, 0, 0].set(jnp.nan).at[-1, -1, -1].set(jnp.inf)


def _rel(a, b) -> float:
  """|a / b - 1|, 0 where the two are equal (also both inf)."""
  a, b = float(a), float(b)
  return 0.0 if a == b else abs(a / b - 1)


def _same(want, got) -> str:
  """How many payload elements and scales of ``got`` [(data, scale_inv)] differ from the
  QTensors ``want``: "same" or "N payloads, M scales differ"."""
  bad_d = sum(int(np.sum(np.asarray(q.data).view(np.uint8) != np.asarray(d).view(np.uint8)))
              for q, (d, _) in zip(want, got))
  bad_s = sum(int(np.sum(~((np.asarray(q.scale_inv) == np.asarray(s))
                           | (np.isnan(q.scale_inv) & np.isnan(s)))))
              for q, (_, s) in zip(want, got))
  return "same" if bad_d == bad_s == 0 else f"{bad_d} payloads, {bad_s} scales differ"


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default="")
  args = ap.parse_args()
  gpu = jax.default_backend() == "gpu"
  runs = 20 if gpu else 2
  RESULTS["device"] = jax.devices()[0].device_kind
  cfg = fp8jax.recipe("fp32_blockwise")
  if not gpu:
    cfg = cfg.replace(impl="pallas")
  spec = cfg.roles.weight
  ws = _weights(gpu, jax.random.key(0))
  bf16 = jnp.bfloat16
  n_elem = sum(w.size for w in ws)

  def xla_once(ws):
    return [jax.vmap(lambda m: qtensor.quantize(m, spec))(w.astype(bf16)) for w in ws]

  def xla_telemetry(ws):
    return [operand_telemetry.expert_sums(jnp.swapaxes(w.astype(bf16), -1, -2), spec)
            for w in ws]

  def kernel(ws, warps=8):
    return [bq.quantize_blocks(w, spec, in_dtype=bf16, num_warps=warps, interpret=not gpu)[:2]
            for w in ws]

  def with_stats(ws):
    return [grouped_operands.weights_once(w, cfg, bf16, True) for w in ws]

  fns = {"xla_once": xla_once, "xla_telemetry": xla_telemetry,
         "xla_both": lambda ws: (xla_once(ws), xla_telemetry(ws)),
         "kernel_w4": lambda ws: kernel(ws, 4), "kernel_w8": kernel, "with_stats": with_stats,
         "copy": lambda ws: [w + 1 for w in ws]}
  for name, fn in fns.items():
    t, times = median_time(jax.jit(fn), [(ws,)], runs)
    moved = {"copy": 8, "xla_telemetry": 4}.get(name, 5) * n_elem  # bytes read + written
    record(name, ms=t * 1e3, gb_s=moved / t / 1e9, times=times)
  kernel_stats = lambda ws: [bq.quantize_blocks(w, spec, in_dtype=bf16, stats=True,  # noqa: E731
                                                interpret=not gpu) for w in ws]
  t, times = median_time(jax.jit(kernel_stats), [(ws,)], runs)
  record("kernel_stats", ms=t * 1e3, gb_s=5 * n_elem / t / 1e9, times=times)
  for label, inputs in (("bench", ws), ("wide", [_wide(w) for w in ws])):
    rounded = [w.astype(bf16) for w in inputs]  # materialized: XLA cannot skip the rounding
    want = jax.jit(lambda ws: [jax.vmap(lambda m: qtensor.quantize(m, spec))(w) for w in ws])(
        rounded)
    tel_want = jax.jit(lambda ws: [operand_telemetry.expert_sums(jnp.swapaxes(w, -1, -2), spec)
                                   for w in ws])(rounded)
    tel_got = jax.jit(with_stats)(inputs)
    record(f"same_bits_{label}",
           kernel=_same(want, jax.jit(kernel)(inputs)),
           kernel_of_bf16=_same(want, jax.jit(lambda ws: [
               bq.quantize_blocks(w, spec, interpret=not gpu)[:2] for w in ws])(rounded)),
           xla_cast_in_jit=_same(want, [(q.data, q.scale_inv)
                                        for q in jax.jit(xla_once)(inputs)]),
           counts=all(np.array_equal(np.asarray(a[k]), np.asarray(b[k]))
                      for (_, a), b in zip(tel_got, tel_want) for k in a
                      if k not in ("sum_q2", "sum_q4", "kurtosis_sum")),
           max_rel_sum=max(_rel(a[k], b[k]) for (_, a), b in zip(tel_got, tel_want)
                           for k in ("sum_q2", "sum_q4", "kurtosis_sum")))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(RESULTS, f, indent=1)


if __name__ == "__main__":
  main()
