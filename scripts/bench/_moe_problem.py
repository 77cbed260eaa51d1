"""The MoE benchmark problem shared by ``study_perf.py --parts=moe``, ``grouped_gemm.py``
and the grouped blockwise benchmarks (:func:`padded_problem`)."""

import _repo  # noqa: F401  (puts the repository on the path before fp8jax is imported)
import jax
import jax.numpy as jnp
import numpy as np

from fp8jax.gemm import padding
from fp8jax.models import moe

D, F_TRUE, F, E, K = 1280, 853, 896, 63, 7  # the 2B MoE: width 853 stored padded to 896


def moe_problem(tokens: int, seed: int = 1, d: int = D, f: int = F, e: int = E, k: int = K
                ) -> dict:
  """bf16 inputs (default: the 2B shapes) with Zipf-skewed routing (max/mean expert load
  ~2.7): a constant feature x[:, 0] = 1 meets a router row 0 that sets each expert's
  popularity.

  Returns:
    dict of x [T, d], weights and ids [T, k] (top-k routing), gate and up [E, d, f],
    down [E, f, d] and a cotangent dy [T, d].
  """
  D, F, E, K = d, f, e, k  # noqa: N806
  key = jax.random.key(seed)
  x = jax.random.normal(key, (tokens, D), jnp.bfloat16).at[:, 0].set(1.0)
  router = jax.random.normal(jax.random.fold_in(key, 1), (D, E), jnp.float32) * 0.02
  zipf = 1.0 / np.arange(1, E + 1) ** 0.8
  router = router.at[0].set(jnp.asarray(np.log(zipf / zipf.sum()) * 0.2, jnp.float32))
  gate, up = (jax.random.normal(jax.random.fold_in(key, i), (E, D, F), jnp.bfloat16) * 0.02
              for i in (2, 3))
  down = jax.random.normal(jax.random.fold_in(key, 4), (E, F, D), jnp.bfloat16) * 0.02
  _, weights, ids = moe.route(x, router, K, False)
  dy = jax.random.normal(jax.random.fold_in(key, 5), (tokens, D), jnp.bfloat16)
  return dict(x=x, weights=weights, ids=ids, gate=gate, up=up, down=down, dy=dy)


def padded_problem(tokens: int, gpu: bool):
  """Rows X [N_pad, d] sorted by expert and padded to 128 per group (as
  ``gemm:fp32_blockwise`` lays them out), a bf16 cotangent dY [N_pad, f] in the same layout,
  the gate weight [E, d, f], the padded group sizes and the FLOPs of one GEMM on the real
  rows. The 2B shapes on a GPU; elsewhere a small problem (64 tokens, d 256, f 256, 4
  experts, top 2) for the interpreter."""
  p = moe_problem(tokens) if gpu else moe_problem(64, d=256, f=256, e=4, k=2)
  ids = p["ids"].reshape(-1)
  e, top_k = p["gate"].shape[0], p["ids"].shape[1]
  order = jnp.argsort(ids, stable=True)
  sizes = jnp.bincount(ids, length=e).astype(jnp.int32)
  x, padded = padding.pad_groups(jnp.take(p["x"], order // top_k, axis=0), sizes, 128)
  dy = jax.random.normal(jax.random.key(9), (x.shape[0], p["gate"].shape[2]), jnp.bfloat16)
  dy, _ = padding.pad_groups(dy[:ids.shape[0]], sizes, 128)
  flop = 2 * ids.shape[0] * p["gate"].shape[1] * p["gate"].shape[2]
  return x, dy, p["gate"], padded, flop
