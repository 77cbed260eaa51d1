"""Accumulation error of the simulated accumulators and of the backend's real FP8 GEMM.

E4M3 operands, per-tensor scales, M = N = 256; error against the float64 product of
the same dequantized operands. On a GPU, ``real fp8`` is ``lax.dot_general`` on float8
operands (XLA emits a cuBLASLt FP8 GEMM). Run from the repository root:

  PYTHONPATH=. python scripts/gpu/check_gemm_accumulation.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import fp8jax
from fp8jax.gemm import accumulate


def main():
  spec = fp8jax.QuantSpec(granularity=fp8jax.per_tensor())
  rng = np.random.default_rng(0)
  sim = jax.jit(accumulate.scaled_matmul, static_argnums=2)
  real = jax.jit(lambda a, b: jnp.einsum("bmk,bnk->bmn", a.data, b.data,
                                         preferred_element_type=jnp.float32)
                 * (a.scale_inv * b.scale_inv).reshape(()))
  print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax {jax.__version__}")
  print(f"{'operands':9} {'K':>6} {'fp32':>9} {'tc never':>9} {'tc 128':>9} {'real fp8':>9}"
        "   (normwise relative error)")
  for dist in ("positive", "gaussian"):
    for k in (1024, 4096, 16384):
      a = rng.uniform(0, 1, (256, k)) if dist == "positive" else rng.standard_normal((256, k))
      b = rng.uniform(0, 1, (256, k)) if dist == "positive" else rng.standard_normal((256, k))
      qa = fp8jax.quantize(jnp.asarray(a[None], jnp.float32), spec)
      qb = fp8jax.quantize(jnp.asarray(b[None], jnp.float32), spec)
      ref = np.asarray(fp8jax.dequantize(qa, jnp.float32), np.float64)[0] @ \
          np.asarray(fp8jax.dequantize(qb, jnp.float32), np.float64)[0].T
      errs = []
      for y in (sim(qa, qb, accumulate.FP32), sim(qa, qb, accumulate.HOPPER_NO_PROMOTION),
                sim(qa, qb, accumulate.HOPPER), real(qa, qb)):
        y = np.asarray(y, np.float64)[0]
        errs.append(np.linalg.norm(y - ref) / np.linalg.norm(ref))
      print(f"{dist:9} {k:6d} " + " ".join(f"{e:9.2e}" for e in errs))


if __name__ == "__main__":
  main()
