"""Platform check: how far a backend's scales and payloads are from IEEE float32.

Compares fp8jax.compute_scale and fp8jax.quantize on the default backend with the
NumPy reference (tests/references/reference.py, subnormal flushing off on GPUs), for FP32 and
power-of-two scales, and prints a table. Run from the repository root:

  PYTHONPATH=. python scripts/gpu/check_platform_numerics.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import fp8jax
from tests.references import reference as ref


def ulp_diff(a, b):
  a = np.asarray(a, np.float32).view(np.int32).astype(np.int64)
  b = np.asarray(b, np.float32).view(np.int32).astype(np.int64)
  return np.abs(a - b)


def main():
  flush = jax.default_backend() == "cpu"
  rng = np.random.default_rng(0)
  amax = (10.0 ** rng.uniform(-12, 30, 200_000)).astype(np.float32)
  print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax "
        f"{jax.__version__}; reference flushes subnormals: {flush}")
  print(f"{'scale rule':14} {'fmt':5} {'s: frac != IEEE':>16} {'max ulp':>8} "
        f"{'1/s: frac !=':>13} {'max ulp':>8}")
  for scale_format, rounding in (("fp32", "floor"), ("pow2", "floor"), ("pow2", "ceil"),
                                 ("pow2", "rceil")):
    for fmt in ("e4m3", "e5m2"):
      spec = fp8jax.QuantSpec(format=fmt, scale_format=scale_format,
                              pow2_rounding=rounding if scale_format == "pow2" else None)
      s, inv = jax.jit(fp8jax.compute_scale, static_argnums=1)(jnp.asarray(amax), spec)
      rs, rinv = zip(*(ref.ref_scale(a, fmt, 1e-12, 0, scale_format, rounding)
                       for a in amax[:20_000]))
      ds, dinv = ulp_diff(s[:20_000], rs), ulp_diff(inv[:20_000], rinv)
      name = scale_format if scale_format == "fp32" else f"pow2/{rounding}"
      print(f"{name:14} {fmt:5} {np.mean(ds > 0):16.4f} {ds.max():8d} "
            f"{np.mean(dinv > 0):13.4f} {dinv.max():8d}")
  x = (rng.standard_normal((256, 1024)) * 10.0 ** rng.uniform(-3, 3, (256, 1))).astype(
      np.float32)
  for scale_format in ("fp32", "pow2"):
    spec = fp8jax.QuantSpec(granularity=fp8jax.tile(128), scale_format=scale_format,
                            pow2_rounding="rceil" if scale_format == "pow2" else None)
    qt = jax.jit(fp8jax.quantize, static_argnums=1)(jnp.asarray(x), spec)
    payload, scale_inv, _ = ref.ref_quantize(
        x, "e4m3", "tile", (-1,), (128,), scale_format=scale_format, rounding="rceil",
        flush_subnormals=flush)
    same_payload = np.mean(np.asarray(qt.data).view(np.uint8) == payload.view(np.uint8))
    same_scale = np.mean(np.asarray(qt.scale_inv).view(np.uint32) == scale_inv.view(np.uint32))
    print(f"quantize 1x128 {scale_format}: payload bytes equal {same_payload:.6f}, "
          f"scales equal {same_scale:.6f}")


if __name__ == "__main__":
  main()
