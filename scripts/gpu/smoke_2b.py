"""Smoke run of the 2B model on one GPU: forward + backward, BF16 and an FP8 policy.

  PYTHONPATH=. python scripts/gpu/smoke_2b.py   (maps models/ as fp8jax.models itself)
"""

import importlib.util
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

import fp8jax

for _name in ("models",):  # map the repo folder as the editable install does
  _root = pathlib.Path(__file__).resolve().parents[2] / _name
  _spec = importlib.util.spec_from_file_location(
      f"fp8jax.{_name}", _root / "__init__.py", submodule_search_locations=[str(_root)])
  _mod = importlib.util.module_from_spec(_spec)
  sys.modules[f"fp8jax.{_name}"] = _mod
  _spec.loader.exec_module(_mod)

from fp8jax.models import config as mc  # noqa: E402
from fp8jax.models import deepseek_moe as dm  # noqa: E402
from fp8jax.models import policy as pl  # noqa: E402


def main():
  cfg = mc.deepseek_moe_2b(expert_pad_to=896)
  params = jax.jit(dm.init, static_argnums=0)(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 1024), 0, cfg.vocab_size)
  policies = {"bf16": pl.BF16,
              "moe_out e4m3 0-8": pl.site_policy("moe_out", "0-8", fp8jax.preset("deepseek_v3")),
              "fp8 gemm": pl.PrecisionPolicy(gemm=fp8jax.gemm.dense.FP32_BLOCKWISE)}
  for name, policy in policies.items():
    def loss(p, policy=policy):
      logits, aux = dm.apply(p, tokens, cfg, policy)
      return dm.lm_loss(logits, tokens) + aux["aux_loss"], aux
    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    try:
      (value, aux), g = step(params)
      jax.block_until_ready(g)
    except jax.errors.JaxRuntimeError as e:
      print(f"{name:18s} failed: {str(e).splitlines()[0][:160]}")
      continue
    t = time.perf_counter()
    (value, aux), g = step(params)
    jax.block_until_ready(g)
    gn = jnp.sqrt(sum(jnp.sum(x.astype(jnp.float32) ** 2) for x in jax.tree.leaves(g)))
    print(f"{name:18s} LM+aux loss {float(value):.4f} aux {float(aux['aux_loss']):.4f} "
          f"|g| {float(gn):.4f} step {time.perf_counter() - t:.3f} s "
          f"(B=2, S=1024, {jax.devices()[0].device_kind})")


if __name__ == "__main__":
  main()
