"""The study's model adapters (``fp8jax.study.comparison.model_api``)."""

import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.study.comparison import model_api


def test_label_loss_is_the_mean_cross_entropy_of_the_labels():
  logits = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]], np.float32)
  labels = np.array([0, 1], np.int32)
  shifted = logits - logits.max(axis=1, keepdims=True)
  logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
  want = -np.mean([logp[0, 0], logp[1, 1]])
  got = model_api.label_loss(jnp.asarray(logits, jnp.bfloat16),
                             {"labels": jnp.asarray(labels)})
  assert got.dtype == jnp.float32 and got.shape == ()
  # bf16 logits: 2, 0, -1, 0.5, 3 are exact in bf16, so the float32 loss matches closely
  assert float(got) == pytest.approx(float(want), rel=1e-6)
  # uniform logits: log C whatever the labels
  uniform = model_api.label_loss(jnp.zeros((4, 5)), {"labels": jnp.asarray([0, 4, 2, 2])})
  assert float(uniform) == pytest.approx(np.log(5.0), rel=1e-6)
