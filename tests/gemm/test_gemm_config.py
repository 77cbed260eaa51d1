"""GemmConfig fields that choose implementations, and the one default accumulation."""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import accumulate, grouped
from fp8jax.gemm import dense as gemm
from fp8jax.models import policy as policy_lib

DN = (((1,), (0,)), ((), ()))  # x [T, K] . w [K, N]


def _xw(t=16, k=256, n=16):
  rng = np.random.default_rng(0)
  return (jnp.asarray(rng.standard_normal((t, k)), jnp.float32),
          jnp.asarray(rng.standard_normal((k, n)) * 0.05, jnp.float32))


def _count_calls(monkeypatch, module, name):
  calls, fn = [], getattr(module, name)
  monkeypatch.setattr(module, name, lambda *a, **k: (calls.append(name), fn(*a, **k))[1])
  return calls


def test_impl_is_static_and_traced_once_per_choice(monkeypatch):
  """``impl`` is part of the config: a jitted function traces once per value (no global
  read at trace time), and only "pallas" takes the (here interpreted) kernel."""
  calls = _count_calls(monkeypatch, accumulate.scaled_matmul_pallas, "scaled_matmul_pallas")
  traces = []

  @functools.partial(jax.jit, static_argnums=2)
  def f(x, w, cfg):
    traces.append(cfg.impl)
    return gemm.fp8_dot_general(x, w, DN, config=cfg)

  x, w = _xw()
  xla, pallas = gemm.GemmConfig(impl="xla"), gemm.GemmConfig(impl="pallas")
  assert xla != pallas and hash(xla) != hash(pallas)
  # The kernel's first trace imports Pallas modules that add options to jit's cache key
  # (which retraces everything once): done here, before the count.
  jax.jit(lambda a, b: gemm.fp8_dot_general(a, b, DN, config=pallas))(x, w)
  calls.clear()
  y_xla = f(x, w, xla)
  assert calls == []
  y_pallas = f(x, w, pallas)
  assert calls == ["scaled_matmul_pallas"]
  f(x, w, xla)  # cached: the choice lives in the static argument
  assert traces == ["xla", "pallas"]
  np.testing.assert_allclose(y_pallas, y_xla, rtol=1e-6, atol=1e-6)
  assert "impl=pallas" in pallas.describe() and "impl" not in gemm.GemmConfig().describe()


@pytest.mark.slow
def test_grouped_impl_xla_never_takes_the_kernel(monkeypatch):
  """The grouped GEMM reads the same field: "pallas" takes the grouped kernel where the
  scales suit it (interpreted off GPU), "xla" never."""
  calls = _count_calls(monkeypatch, grouped.grouped_scaled_pallas, "grouped_scaled_matmul")
  x, w = _xw(t=256, k=128, n=128)
  ws, sizes = jnp.stack([w[:, :128], w[:, :128] * 2]), jnp.asarray([100, 156], jnp.int32)
  y_xla = grouped.fp8_ragged_dot(x, ws, sizes, gemm.GemmConfig(impl="xla"))
  assert calls == []
  y_pallas = grouped.fp8_ragged_dot(x, ws, sizes, gemm.GemmConfig(impl="pallas"))
  assert calls == ["grouped_scaled_matmul"]
  np.testing.assert_allclose(y_pallas, y_xla, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_fp8_mma_reaches_the_dense_kernel(monkeypatch):
  """``fp8_mma`` asks the dense blockwise kernel for FP8 dots in Fprop, Dgrad and Wgrad;
  interpreted, the gradients equal those without it to float32 rounding."""
  kernel = accumulate.scaled_matmul_pallas
  calls, fn = [], kernel.scaled_matmul_pallas
  monkeypatch.setattr(kernel, "scaled_matmul_pallas", lambda *a, **k: (
      calls.append(k["fp8_dots"]), fn(*a, **k))[1])
  x, w = _xw(t=128, k=256, n=128)
  mma = fp8jax.recipe("fp32_blockwise_mma").replace(impl="pallas")

  def grads(cfg):
    return jax.grad(lambda a, b: jnp.sum(jnp.sin(gemm.fp8_dot_general(a, b, DN, config=cfg))),
                    argnums=(0, 1))(x, w)

  got = grads(mma)
  assert calls == [True] * 3
  calls.clear()
  want = grads(mma.replace(fp8_mma=False))
  assert calls == [False] * 3
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_fp8_mma_reaches_the_grouped_kernel(monkeypatch):
  """``fp8_mma`` (recipe ``fp32_blockwise_mma``) asks the grouped Fprop and Dgrad kernels for
  FP8 tensor-core dots; in the interpreter those are exact products summed in float32, so
  the gradients equal ``fp32_blockwise``'s to float32 rounding. Records show the field only
  when it is set."""
  kernel = grouped.grouped_scaled_pallas
  calls, fn = [], kernel.grouped_scaled_matmul
  monkeypatch.setattr(kernel, "grouped_scaled_matmul", lambda *a, **k: (
      calls.append(k["fp8_dots"]), aligned.append(k["groups_aligned"]), fn(*a, **k))[2])
  aligned = []
  x, w = _xw(t=256, k=128, n=128)
  ws, sizes = jnp.stack([w[:, :128], w[:, :128] * 2]), jnp.asarray([100, 156], jnp.int32)
  mma = fp8jax.recipe("fp32_blockwise_mma").replace(impl="pallas")
  assert mma == fp8jax.recipe("fp32_blockwise").replace(impl="pallas", fp8_mma=True)

  def loss(cfg):
    return jax.grad(lambda a, b: jnp.sum(jnp.sin(grouped.fp8_ragged_dot(a, b, sizes, cfg))),
                    argnums=(0, 1))(x, ws)

  got = loss(mma)
  assert calls == [True, True]  # Fprop, Dgrad
  assert aligned == [False, False]  # unpadded rows (group_multiple 1): row masks
  calls.clear()
  want = loss(mma.replace(fp8_mma=False))
  assert calls == [False, False]
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert "fp8_mma" in mma.describe() and "fp8_mma" not in mma.replace(fp8_mma=False).describe()
  rec = policy_lib.record(policy_lib.parse_policy("gemm:fp32_blockwise_mma"))
  assert rec["gemm"]["fp8_mma"] is True
  assert "fp8_mma" not in policy_lib.record(policy_lib.parse_policy("gemm:fp32_blockwise"))[
      "gemm"]


@pytest.mark.parametrize("kwargs,match", [
    (dict(impl="triton"), "unknown GemmConfig impl 'triton'"),
    (dict(impl="pallas", accumulation=accumulate.HOPPER), "FP32 accumulation only"),
    (dict(fp8_mma=True, accumulation=accumulate.HOPPER), "fp8_mma .* needs FP32 accumulation"),
    (dict(fp8_mma=True, impl="xla"), "impl 'auto' or 'pallas', got .* impl='xla'"),
])
def test_invalid_impl(kwargs, match):
  with pytest.raises(ValueError, match=match):
    gemm.GemmConfig(**kwargs)


def test_policy_record_shows_impl_only_when_chosen():
  """Records written before the field existed (no ``impl``) still equal the default's."""
  rec = policy_lib.record(policy_lib.parse_policy("gemm:fp32_blockwise"))
  assert "impl" not in rec["gemm"] and "transpose" in rec["gemm"]
  assert "fp8_mma" not in rec["gemm"]
  chosen = policy_lib.PrecisionPolicy(gemm=gemm.GemmConfig(impl="xla"), name="x")
  assert policy_lib.record(chosen)["gemm"]["impl"] == "xla"


def test_one_default_accumulation():
  """``fp8_dot_general``, ``fp8_einsum``, ``fp8_ragged_dot`` and ``GemmConfig()`` share the
  default: FP32 accumulation with the DeepSeek-V3 roles."""
  for fn in (gemm.fp8_dot_general, gemm.fp8_einsum, grouped.fp8_ragged_dot):
    assert inspect.signature(fn).parameters["config"].default == gemm.GemmConfig(), fn
  assert gemm.GemmConfig().accumulation == accumulate.FP32
  x, w = _xw(k=512)
  np.testing.assert_array_equal(gemm.fp8_dot_general(x, w, DN),
                                gemm.fp8_dot_general(x, w, DN, config=fp8jax.GemmConfig()))
