"""The gradient comparison's sums read each gradient once: masked experts by selecting the
slices' sums (against a float64 zero-filled reference), and the finiteness probe from the
same read (its use by the variant pass: ``tests/study/comparison/test_paired.py``)."""

from hypothesis import given, settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax import metrics
from tests import strategies as hs
from tests.metrics.test_metrics import DS, _hand_case


def _np_leaf_sums(b, f, mb, mf, per_slice):
  """float64 reference of ``leaf_sums``: the zero-filled gradients, summed term by term."""
  b, f = b.astype(np.float64), f.astype(np.float64)
  shape = (-1,) + (1,) * (b.ndim - 1)
  fb = np.where(mb.reshape(shape), b, 0.0)
  ff = np.where(mf.reshape(shape), f, 0.0)
  both = (mb & mf).reshape(shape)
  d = ff - fb
  ib, idf = np.where(both, fb, 0.0), np.where(both, d, 0.0)
  axis = tuple(range(1, b.ndim)) if per_slice else None
  terms = (d * d, idf * idf, fb * fb, ff * ff, fb * ff, ib * ib)
  return np.stack([np.sum(t, axis=axis) for t in terms], axis=-1)


_leaf_sums = jax.jit(metrics.leaf_sums, static_argnames="per_slice")
"""Compiled whole, as compare_grads runs it (op by op, its operations would compile one by
one for every shape drawn)."""


@settings(max_examples=hs.examples(12, 40))  # each shape drawn compiles
@given(seed=st.integers(0, 2**31 - 1), experts=st.integers(1, 5), per_slice=st.booleans(),
       poison=st.booleans(), absent=st.sampled_from(["", "bf16", "fp8"]),
       rank=st.sampled_from([1, 3]))
def test_leaf_sums_match_the_zero_filled_reference(seed, experts, per_slice, poison, absent,
                                                   rank):
  rng = np.random.default_rng(seed)
  b = rng.standard_normal((experts, 3, 2)[:rank]).astype(np.float32)
  f = (b + 0.3 * rng.standard_normal(b.shape)).astype(np.float32)
  mb, mf = rng.random(experts) < 0.6, rng.random(experts) < 0.6
  if absent == "bf16":  # no mask: every expert active
    mb[:] = True
  elif absent == "fp8":
    mf[:] = True
  if poison:  # non-finite values of inactive experts must not reach the sums
    f[~mf] = np.nan
    b[~mb] = np.inf
  masks = [None if absent == "bf16" else jnp.asarray(mb),
           None if absent == "fp8" else jnp.asarray(mf)]
  got = np.asarray(_leaf_sums(jnp.asarray(b), jnp.asarray(f), *masks, per_slice=per_slice))
  want = _np_leaf_sums(b, f, mb, mf, per_slice)
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_stack_of_no_experts_sums_to_zero():
  empty = jnp.zeros((0, 3, 2), jnp.float32)
  none = jnp.zeros((0,), bool)
  assert metrics.leaf_sums(empty, empty, none, none, per_slice=True).shape == (0, 6)
  np.testing.assert_array_equal(metrics.leaf_sums(empty, empty, none, none), np.zeros(6))


@pytest.mark.slow
def test_finite_probe_is_finite_only_where_every_element_is():
  gb, gf, mask_b, mask_f = _hand_case()
  flat = metrics.paths.flatten(gf)
  paths = list(flat)
  expert = "layers/1/mlp/experts_gate"
  inactive = int(np.flatnonzero(~np.asarray(mask_f[1]))[0])
  bad = {k: np.array(v) for k, v in flat.items()}
  bad[expert][inactive, 0, 0] = np.nan  # an expert the fp8 pass did not route to
  bad["lm_head/kernel"][0, :2] = [np.inf, -np.inf]
  tree = jax.tree_util.tree_unflatten(jax.tree.structure(gf), list(bad.values()))
  res = metrics.compare_grads(gb, tree, mask_b, mask_f, classifier=DS, finite_probe=True)
  ok = np.asarray(res["fp8_sq_finite"])
  want = np.ones(len(paths), bool)
  want[paths.index(expert)] = want[paths.index("lm_head/kernel")] = False
  np.testing.assert_array_equal(ok, want)
  clean = metrics.compare_grads(gb, gf, mask_b, mask_f, classifier=DS, finite_probe=True)
  np.testing.assert_array_equal(res["per_expert"][expert]["diff_norm"],
                                clean["per_expert"][expert]["diff_norm"])
  assert np.all(np.asarray(clean["fp8_sq_finite"]))
  huge = jax.tree.map(lambda v: np.full_like(v, 1e30), gf)  # finite; the squares overflow
  assert not np.any(np.asarray(metrics.compare_grads(
      gb, huge, classifier=DS, finite_probe=True)["fp8_sq_finite"]))
  assert "fp8_sq_finite" not in metrics.compare_grads(gb, gf, classifier=DS)
