"""The MoE benchmark problem shared by ``study_perf.py --parts=moe`` and ``grouped_gemm.py``."""

import _repo  # noqa: F401  (puts the repository on the path before fp8jax is imported)
import jax
import jax.numpy as jnp
import numpy as np

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
