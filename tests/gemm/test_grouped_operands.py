"""The routed experts' weights quantized once, from the parameters, for both the grouped
GEMM and its operand telemetry (``moe.experts_weights_once``): the same logits, gradients
and telemetry as when the GEMM quantizes each weight itself and the telemetry again.

On the CPU the kernels run interpreted: ``kernels_on`` is patched to hold for FP32
accumulation, as on one GPU.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.gemm import grouped, grouped_operands, operand_telemetry
from fp8jax.kernels import block_quant_pallas
from fp8jax.models import config as config_lib
from fp8jax.models import deepseek_moe, moe
from fp8jax.models import policy as policy_lib

# 128-wide hidden and expert widths: whole 128 x 128 weight blocks, for the one-read kernel
CFG = config_lib.tiny(num_hidden_layers=2, hidden_size=128, moe_intermediate_size=128,
                      n_routed_experts=4)


def _grads(policy):
  params = deepseek_moe.init(CFG, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 64), 0, CFG.vocab_size)

  def loss(p):
    logits, aux = deepseek_moe.apply(p, tokens, CFG, policy, gemm_telemetry=True)
    return deepseek_moe.lm_loss(logits, tokens), (logits, aux["gemm_telemetry"])

  return jax.device_get(jax.jit(jax.value_and_grad(loss, has_aux=True))(params))


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["fp32_blockwise_mma"])
def test_once_equals_quantizing_apart(recipe, monkeypatch):
  monkeypatch.setattr(grouped_operands, "kernels_on",
                      lambda cfg: cfg.accumulation.mode == "fp32")
  calls = []
  kernel = block_quant_pallas.quantize_blocks
  monkeypatch.setattr(block_quant_pallas, "quantize_blocks",
                      lambda w, spec, **k: (calls.append((w.dtype, k["stats"])),
                                            kernel(w, spec, **k))[1])
  policy = policy_lib.parse_policy(f"gemm:{recipe}")
  (loss, (logits, tel)), grads = _grads(policy)
  # one read per weight: the float32 parameters, with the telemetry's statistics
  assert calls == [(np.dtype("float32"), True)] * 3
  calls.clear()
  with monkeypatch.context() as m:
    m.setattr(moe, "experts_weights_once", lambda *a: (None, None))
    (want_loss, (want_logits, want_tel)), want_grads = _grads(policy)
  # the GEMM quantizes each bfloat16 weight itself; the telemetry quantizes W^T again (XLA)
  assert calls == [(np.dtype("bfloat16"), False)] * 3
  assert loss == want_loss
  np.testing.assert_array_equal(logits, want_logits)
  for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(grads)[0],
                          jax.tree.leaves(want_grads), strict=True):
    np.testing.assert_array_equal(g, w, err_msg=jax.tree_util.keystr(path))
  routed = [path for path in tel if path.endswith("experts") and "shared" not in path]
  assert len(routed) == 1
  assert set(tel[routed[0]]) == {"input", "weight_gate", "weight_up", "weight_down"}
  for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(tel)[0],
                               jax.tree.leaves(want_tel), strict=True):
    key = jax.tree_util.keystr(path)
    if any(s in key for s in ("sum_q2", "sum_q4", "kurtosis_sum")):
      np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=key)  # summed in another order
    else:
      np.testing.assert_array_equal(got, want, err_msg=key)


def _cfg(b=32):
  base = fp8jax.recipe("fp32_blockwise").replace(impl="pallas")
  weight = base.roles.weight.replace(granularity=fp8jax.block((b, b)))
  return base.replace(roles=dataclasses.replace(base.roles, weight=weight))


@pytest.mark.slow
def test_weights_once_without_the_kernel_gives_the_telemetry_of_w_transposed():
  """Shapes the kernel does not take (100 rows: no whole 32-row blocks) go through XLA:
  the quantization of ``w.astype(dtype)`` and the telemetry ``expert_sums`` gives W^T."""
  w = jax.random.normal(jax.random.key(3), (2, 100, 64), jnp.float32)
  cfg = _cfg()
  assert not block_quant_pallas.supports(w.shape, cfg.roles.weight)
  qt, sums = grouped_operands.weights_once(w, cfg, jnp.bfloat16)
  want = grouped_operands.weight_quantized_once(w.astype(jnp.bfloat16), cfg)
  np.testing.assert_array_equal(np.asarray(qt.data).view(np.uint8),
                                np.asarray(want.data).view(np.uint8))
  tel = operand_telemetry.expert_sums(jnp.swapaxes(w.astype(jnp.bfloat16), -1, -2),
                                      cfg.roles.weight)
  for k, v in tel.items():
    np.testing.assert_allclose(np.asarray(sums[k]), np.asarray(v), rtol=1e-5, err_msg=k)
  assert grouped_operands.weights_once(w, cfg, jnp.bfloat16, telemetry=False)[1] is None


def test_fp8_ragged_dot_refuses_a_w_once_that_does_not_fit():
  w = jnp.zeros((2, 64, 64), jnp.float32)
  x, sizes = jnp.zeros((64, 64), jnp.bfloat16), jnp.asarray([32, 32], jnp.int32)
  qt, _ = grouped_operands.weights_once(w, _cfg(), jnp.bfloat16, telemetry=False)
  with pytest.raises(ValueError, match="w_once must quantize w"):
    grouped.fp8_ragged_dot(x, w[:, :, :32], sizes, _cfg(), w_once=qt)  # another shape
  with pytest.raises(ValueError, match="w_once must quantize w"):  # no weight_once here
    grouped.fp8_ragged_dot(x, w, sizes, _cfg().replace(impl="xla"), w_once=qt)
  with pytest.raises(ValueError, match="weights_once needs a config"):
    grouped_operands.weights_once(w, _cfg().replace(impl="xla"), jnp.bfloat16)
