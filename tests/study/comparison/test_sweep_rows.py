"""The lines a sweep writes from a reference pass: its baseline.jsonl fields, and the
tokens its router sent to each expert."""

import jax.numpy as jnp
import numpy as np

from fp8jax.study.comparison import paired, sweep_rows

PARAMS = {"a": jnp.zeros(2), "b": {"c": jnp.zeros(3), "d": jnp.zeros(1)}}


def _base(nonfinite: int) -> paired.Baseline:
  return paired.Baseline(jnp.float32(2.5), jnp.float32(2.0), jnp.float32(0.5), PARAMS,
                         jnp.float32(3.0), {}, jnp.bool_(nonfinite < 0), jnp.int32(nonfinite))


def test_baseline_row_names_the_first_nonfinite_gradient():
  assert sweep_rows.baseline_row(_base(-1), PARAMS) == {
      "loss": 2.5, "lm_loss": 2.0, "aux_loss": 0.5, "grad_norm": 3.0, "finite": True,
      "nonfinite": None}
  row = sweep_rows.baseline_row(_base(2), PARAMS)
  assert not row["finite"] and row["nonfinite"] == "grads/b/d"  # leaves a, b/c, b/d


def test_expert_tokens_of_routed_layers_only():
  routing = {1: {"expert_counts": np.array([3, 0, 5]), "topk_ids": np.zeros((2, 4))},
             0: {"topk_ids": np.zeros((2, 4))}}
  assert sweep_rows.expert_tokens(routing) == {"1": [3, 0, 5]}
  assert sweep_rows.expert_tokens({}) == {}
