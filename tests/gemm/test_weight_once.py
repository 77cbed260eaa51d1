"""Each expert weight quantized once for the grouped GEMM's Fprop and Dgrad
(``grouped_operands.weight_once``): with square scale blocks the quantization of W is the
transpose of that of W^T (``tests/quant/test_qtensor.py``), so the GEMM keeps one 8-bit
weight for both directions."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import grouped, grouped_operands, padding
from fp8jax.numerics import granularity


def test_weight_once_only_where_the_bits_cannot_change():
  base = fp8jax.recipe("fp32_blockwise").replace(impl="pallas")
  assert grouped_operands.weight_once(base)
  assert grouped_operands.weight_once(base.replace(transpose="scaling_aware"))
  assert not grouped_operands.weight_once(base.replace(transpose="double"))
  assert not grouped_operands.weight_once(base.replace(impl="xla"))
  assert not grouped_operands.weight_once(base.replace(dgrad="bf16"))
  # the scaling-aware transpose refuses two-level scales: so does weight_once
  nvfp4 = fp8jax.recipe("nvfp4_recipe_no_rht").replace(impl="pallas", wgrad="bf16")
  assert grouped_operands.weight_once(nvfp4)
  assert not grouped_operands.weight_once(nvfp4.replace(transpose="scaling_aware"))
  w = base.roles.weight
  for spec in (w.replace(granularity=granularity.block((128, 64))),
               w.replace(granularity=granularity.tile(128)),
               w.replace(rounding="stochastic")):
    cfg = base.replace(roles=dataclasses.replace(base.roles, weight=spec))
    assert not grouped_operands.weight_once(cfg), spec


@pytest.mark.parametrize("recipe,transpose,f", [
    pytest.param("fp32_blockwise", "requant", 384, marks=pytest.mark.slow),
    pytest.param("fp32_blockwise_mma", "scaling_aware", 384, marks=pytest.mark.slow),
    pytest.param("fp32_blockwise_e8m0", "requant", 320, marks=pytest.mark.slow)])
def test_fprop_and_dgrad_read_one_quantization_with_the_same_bits(recipe, transpose, f,
                                                                   monkeypatch):
  """Y, dX and dW bit for bit those of the path that quantizes W^T for Fprop and W for
  Dgrad, and no weight is quantized again; with E8M0-stored weight scales and a partial
  block of F, through the XLA products (the kernels take float32 scales)."""
  rng = np.random.default_rng(7)
  sizes = jnp.asarray([130, 0, 100], jnp.int32)
  n = padding.padded_count(int(sizes.sum()), 3, 128)
  x, dy = (jnp.asarray(rng.standard_normal((n, d)), jnp.bfloat16) for d in (256, f))
  _, real = padding.padded_rows(sizes, int(sizes.sum()), n, 128)
  x, dy = x * real[:, None], dy * real[:, None]
  w = jnp.asarray(rng.standard_normal((3, 256, f)) * 0.05, jnp.float32)
  w = w.at[1, :128, 256:].multiply(1e4)  # blocks of very different scales
  xla = recipe.endswith("e8m0")
  if xla:
    base = fp8jax.recipe("fp32_blockwise")
    weight = base.roles.weight.replace(scale_format="pow2", pow2_rounding="rceil",
                                       store_e8m0=True)
    cfg = base.replace(roles=dataclasses.replace(base.roles, weight=weight))
  else:
    cfg = fp8jax.recipe(recipe)
  cfg = cfg.replace(impl="pallas", transpose=transpose)
  assert grouped_operands.weight_once(cfg)

  def run():
    y, vjp = jax.vjp(lambda a, b: grouped.fp8_ragged_dot(a, b, sizes, cfg, 128), x, w)
    return (y, *vjp(dy))

  calls = []
  for name in ("_weight_q", "_dgrad_weight_q"):
    fn = getattr(grouped, name)
    monkeypatch.setattr(grouped, name, lambda *a, _f=fn, _n=name: (calls.append(_n),
                                                                   _f(*a))[1])
  kernel = grouped.grouped_scaled_pallas.grouped_scaled_matmul
  monkeypatch.setattr(grouped.grouped_scaled_pallas, "grouped_scaled_matmul",
                      lambda *a, **k: (calls.append(k["transpose_b"]), kernel(*a, **k))[1])
  got = run()
  # Fprop reads W [E, K, F] transposed, or (FP8 dots) XLA's swapped payload; Dgrad as it is
  assert calls == ([] if xla else [recipe.endswith("mma"), True])
  calls.clear()
  with monkeypatch.context() as m:
    m.setattr(grouped.grouped_operands, "weight_once", lambda cfg: False)
    want = run()
  assert calls == (["_weight_q", "_dgrad_weight_q"] if xla
                   else ["_weight_q", True, "_dgrad_weight_q", True])
  for g, r, what in zip(got, want, ("y", "dx", "dw"), strict=True):
    g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
    assert np.any(g != 0), what
    np.testing.assert_array_equal(g, r, err_msg=what)
