"""A Flax model as a registered family (models/flax_lm.py): every GEMM on a parameter
reached by its policies (a tied head and a raw matmul included), its BF16 baseline, and a
family found by importing the module of its name."""

import sys
import textwrap

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax.metrics.paths import Classifier
from fp8jax.models import api, flax_lm, registry

TOKENS = jax.random.randint(jax.random.key(1), (2, 16), 0, 64, dtype=jnp.int32)


class TiedLM(nnx.Module):
  """A head tied to the embedding and a weight used directly: GEMMs no hook reaches."""

  def __init__(self, rngs, vocab=64, d=32, layers=2):
    self.embed = nnx.Embed(vocab, d, rngs=rngs)
    self.blocks = nnx.List([nnx.Linear(d, d, rngs=rngs) for _ in range(layers)])
    self.w = nnx.Param(jax.random.normal(rngs.params(), (d, d)) * 0.1)

  def __call__(self, tokens):
    x = self.embed(tokens)
    for block in self.blocks:
      x = x + jax.nn.gelu(block(x))
    x = x @ self.w
    return x @ self.embed.embedding.T


GROUPS = Classifier.from_patterns({"embed": "^embed/", "blocks": "^blocks/", "w": "^w$"},
                                  layer=r"^blocks/(\d+)/")


def _model(**kwargs):
  return flax_lm.nnx_model("tied:tiny", TiedLM, GROUPS, vocab_size=64, max_len=32,
                           layer_path="blocks/{i}", **kwargs)


def test_every_gemm_on_a_parameter_is_quantized_the_tied_head_too():
  model = _model()
  policy = model.policy("gemm:mxfp8")
  assert model.direct(policy) == {("embed", None), ("blocks", 0), ("blocks", 1), ("w", None)}
  assert model.direct(model.policy(r"gemm:mxfp8@embed")) == {("embed", None)}  # the head
  assert model.direct(model.baseline) == frozenset()
  assert model.policy_meta(policy)["direct"]
  with pytest.raises(ValueError, match="matches no GEMM"):
    model.policy("gemm:mxfp8@head")  # no such parameter
  with pytest.raises(ValueError, match="quantize_gemms quantizes GEMMs"):
    model.policy("output:e4m3@blocks/0")  # no module boundaries on this route
  # the NVFP4 recipe keeps the last 16% of the layers (here: 1 of 2) in BF16
  assert model.direct(model.policy("gemm:nvfp4_recipe")) == {("embed", None), ("blocks", 0),
                                                              ("w", None)}


@pytest.mark.slow
def test_the_baseline_is_the_module_in_bf16_and_a_policy_changes_it():
  model = _model()
  params = model.init(jax.random.key(0))
  module = TiedLM(rngs=nnx.Rngs(0))
  nnx.update(module, jax.tree.map(lambda x: x.astype(jnp.bfloat16),
                                  nnx.state(module, nnx.Param)))
  apply = jax.jit(model.apply, static_argnums=2)
  base, aux = apply(params, TOKENS, model.baseline)
  assert aux == {} and base.dtype == jnp.float32 and base.shape == (2, 16, 64)
  np.testing.assert_array_equal(base, nnx.jit(lambda m, t: m(t))(module, TOKENS))
  quantized, _ = apply(params, TOKENS, model.policy("gemm:mxfp8"))
  assert not np.array_equal(quantized, base) and np.isfinite(quantized).all()
  g = jax.grad(lambda p: model.loss(apply(p, TOKENS, model.policy("gemm:mxfp8"))[0],
                                    TOKENS))(params)
  assert jax.tree.map(lambda x: x.dtype, g) == jax.tree.map(lambda x: x.dtype, params)
  kept = _model(compute_dtype=None)
  assert jax.jit(kept.apply, static_argnums=2)(params, TOKENS, kept.baseline)[0].dtype == \
      jnp.float32


def test_model_facts_from_its_own_shapes():
  model = _model()
  params = model.abstract_params()
  assert params["w"].shape == (32, 32) and model.vocab_size == 64 and model.max_len == 32
  assert model.meta == {"model": "tied:tiny"}
  matmul = sum(int(np.prod(p.shape)) for k, p in [("w", params["w"]),
                                                   ("e", params["embed"]["embedding"])])
  matmul += sum(int(np.prod(b["kernel"].shape)) for b in params["blocks"].values())
  assert model.flops_per_token(16) >= 6 * matmul  # forward + backward, with the rest


class WithDropout(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(4, 4, rngs=rngs)
    self.drop = nnx.Dropout(0.1, rngs=rngs)

  def __call__(self, x):
    return self.drop(self.lin(x))


def test_a_model_with_state_besides_its_params_is_refused():
  with pytest.raises(ValueError, match="other than nnx.Param"):
    flax_lm.nnx_model("drop:tiny", WithDropout, GROUPS, vocab_size=4, max_len=4)


def test_a_family_is_found_by_importing_the_module_of_its_name(tmp_path, monkeypatch):
  (tmp_path / "fp8jax_test_family.py").write_text(textwrap.dedent("""
      from fp8jax.models import flax_lm
      from tests.models.test_flax_lm import GROUPS, TiedLM
      flax_lm.register_nnx("fp8jax_test_family", TiedLM, GROUPS, vocab_size=64, max_len=32,
                           sizes={"tiny": {}, "wide": {"d": 64}})
      """))
  (tmp_path / "fp8jax_test_broken.py").write_text("import fp8jax_no_such_package\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  model = registry.get("fp8jax_test_family:wide", overrides={"layers": 1})
  assert isinstance(model, api.Model) and model.name == "fp8jax_test_family:wide"
  assert model.abstract_params()["w"].shape == (64, 64)
  assert model.meta == {"model": "fp8jax_test_family:wide", "d": 64, "layers": 1}
  assert "fp8jax_test_family:tiny" in registry.known()
  with pytest.raises(ValueError, match="unknown fp8jax_test_family size 'huge'"):
    registry.get("fp8jax_test_family:huge")
  with pytest.raises(ValueError, match="has no options"):
    registry.get("fp8jax_test_family:tiny", options={"scan": True})
  with pytest.raises(ValueError, match="unknown model 'fp8jax_no_such_module:tiny'"):
    registry.get("fp8jax_no_such_module:tiny")
  with pytest.raises(ModuleNotFoundError, match="fp8jax_no_such_package"):
    registry.get("fp8jax_test_broken:tiny")  # its own import error, not "unknown"
  with pytest.raises(ValueError, match="unknown model"):
    registry.get("not a module:tiny")
  assert "fp8jax_test_family" in sys.modules
