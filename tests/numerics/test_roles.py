"""RoleSpecs: per-role specs and amax epsilons."""

import jax.numpy as jnp
import numpy as np
import pytest

import fp8jax
from fp8jax.numerics import roles


def test_per_role_eps_changes_only_that_role():
  base = roles.deepseek_v3_roles()
  tuned = base.with_amax_eps(input=1e-4, grad=0.0)
  assert (tuned.input.eps, tuned.weight.eps, tuned.grad.eps) == (1e-4, 1e-12, 0.0)
  assert tuned.weight == base.weight and hash(tuned) != hash(base)
  # A tile of tiny activations: the 1e-4 floor caps its scale, the 1e-12 floor does not.
  x = jnp.full((1, 128), 1e-6)
  s_inp = 1.0 / fp8jax.quantize(x, tuned.input).scale_inv
  s_base = 1.0 / fp8jax.quantize(x, base.input).scale_inv
  np.testing.assert_allclose(s_inp, 448 / 1e-4, rtol=1e-6)
  np.testing.assert_allclose(s_base, 448 / 1e-6, rtol=1e-6)


def test_roles_layout_and_errors():
  r = roles.deepseek_v3_roles()
  assert r.weight.granularity == fp8jax.block((128, 128))
  assert r.spec("grad").granularity == fp8jax.tile(128)
  assert r.replace_all(format="e5m2").weight.format == "e5m2"
  with pytest.raises(ValueError, match="unknown role 'bias'"):
    r.spec("bias")
  with pytest.raises(TypeError, match="role 'weight' needs a QuantSpec"):
    roles.RoleSpecs(input=r.input, weight=None, grad=r.grad)


def test_backward_copies_default_to_their_role_and_follow_its_changes():
  """A copy without its own spec is its role's (and follows role changes); one with its own
  keeps it, and the role-wide helpers (eps, replace_all, map) reach it too."""
  r = roles.deepseek_v3_roles()
  nv = fp8jax.preset("nvfp4").replace(backward=None)
  assert [r.operand(g, role) for g, role in roles.COPIES] == [
      r.input, r.weight, r.grad, r.weight, r.input, r.grad]
  own = roles.RoleSpecs(r.input, r.weight, r.grad, wgrad_grad=nv)
  assert own.operand("wgrad", "grad") == nv and own.operand("dgrad", "grad") == r.grad
  assert own.specs() == (r.input, r.weight, r.grad, nv) and own != r
  tuned = own.with_amax_eps(grad=1e-3)
  assert tuned.grad.eps == tuned.wgrad_grad.eps == 1e-3 and tuned.dgrad_weight is None
  assert own.replace_all(eps=0.5).wgrad_grad == nv.replace(eps=0.5)
  assert own.map(lambda s: s.replace(noise_control=True)).wgrad_grad.noise_control
  with pytest.raises(ValueError, match="fprop reads no 'grad' operand"):
    r.operand("fprop", "grad")
  with pytest.raises(TypeError, match="dgrad_weight needs a QuantSpec or None"):
    roles.RoleSpecs(r.input, r.weight, r.grad, dgrad_weight="nvfp4")
