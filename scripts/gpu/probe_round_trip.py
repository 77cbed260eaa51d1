"""Does XLA keep an f32 -> fp8 -> f32 round trip, with and without a barrier?

Run on each backend (python scripts/gpu/probe_round_trip.py); prints one line per
variant: whether the compiled module still converts to fp8 and whether values changed.
"""

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np


def plain(v):
  return (v * 3.0).astype(jnp.float8_e4m3fn).astype(jnp.float32) / 3.0


def barrier(v):
  q = lax.optimization_barrier((v * 3.0).astype(jnp.float8_e4m3fn))
  return q.astype(jnp.float32) / 3.0


def main():
  x = jnp.asarray(np.linspace(-1.7, 2.3, 4096, dtype=np.float32))
  print(f"backend {jax.default_backend()}, jax {jax.__version__}")
  for name, fn in (("plain astype round trip", plain), ("with optimization_barrier", barrier)):
    f = jax.jit(fn)
    hlo = f.lower(x).compile().as_text()
    changed = not np.array_equal(np.asarray(f(x)), np.asarray(x * 3.0 / 3.0))
    print(f"{name:28s} fp8 convert in HLO: {'f8e4m3fn' in hlo}; values quantized: {changed}")


if __name__ == "__main__":
  main()
