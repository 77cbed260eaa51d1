"""The FP8 parameter gather (fp8jax/train/param_gather.py): blockwise quantization of each
matrix with a straight-through gradient, and its memory estimate against a hand count."""

import jax
import numpy as np
import pytest

import fp8jax
from fp8jax.models import config as mc
from fp8jax.models import deepseek_model
from fp8jax.models import deepseek_moe as dm
from fp8jax.train import optim, param_gather
from fp8jax.train import step as step_lib
from tests.references import reference as ref
from tests.train.test_train_precision import TINY_BF16_BYTES, TINY_FP8_BYTES


@pytest.mark.slow
def test_param_gather_quantizes_each_matrix_blockwise_with_a_straight_through_gradient():
  cfg = mc.tiny(dtype="float32")
  params = dm.init(cfg, jax.random.key(0))
  gathered = jax.jit(param_gather.gather)(params)
  spec = fp8jax.QuantSpec(format="e4m3", granularity=fp8jax.block((128, 128)))
  for (path, p), q in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                          jax.tree.leaves(gathered)):
    if p.ndim < 2:
      np.testing.assert_array_equal(q, p)
      continue
    np.testing.assert_array_equal(q, jax.jit(fp8jax.fake_quant, static_argnums=1)(p, spec))
    _, _, want = ref.ref_quantize(np.asarray(p), "e4m3", "block", (-2, -1), (128, 128))
    assert ref.same_bits(np.asarray(q), want), path
    assert not np.array_equal(q, p)
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
  loss = lambda p: dm.lm_loss(dm.apply(p, tokens, cfg)[0], tokens)  # noqa: E731
  through = jax.jit(jax.grad(lambda p: loss(param_gather.gather(p))))(params)
  at_gathered = jax.jit(jax.grad(loss))(gathered)
  for a, b in zip(jax.tree.leaves(through), jax.tree.leaves(at_gathered)):
    np.testing.assert_array_equal(a, b)
  tx = optim.optimizer(optim.OptimConfig(warmup_steps=1, total_steps=10))
  step = jax.jit(step_lib.make_train_step(deepseek_model.model(cfg), tx, fp8_param_gather=True))
  _, m = step(step_lib.init_state(params, tx), tokens)
  loss = jax.jit(loss)
  assert float(m["lm_loss"]) == pytest.approx(float(loss(gathered)), rel=1e-6)
  assert float(m["lm_loss"]) != pytest.approx(float(loss(params)), rel=1e-6)


def test_param_gather_memory_estimate_matches_a_hand_count():
  est = param_gather.memory_estimate(dm.abstract_params(mc.tiny()))
  assert est["bf16_bytes"] == TINY_BF16_BYTES and est["fp8_bytes"] == TINY_FP8_BYTES
  assert est["scale_bytes"] == 4 * 77 and est["unquantized_bytes"] == 2 * 448
  assert est["saving_gib"] == (TINY_BF16_BYTES - TINY_FP8_BYTES) / 2**30
