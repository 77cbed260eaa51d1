"""The paired study on models other than DeepSeek-MoE: a dense NNX model written here
(fast), and CanViT from the canvit-nnx package, quantized by rules with no edit to its
source. CanViT's smallest shipped backbone has 22M parameters (minutes on a CPU): the test
registers a 2-block backbone in the package's own table ``canvit_core.backbone.BACKBONES``,
which the config reads by name."""

import json
import re

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp8jax import metrics
from fp8jax.gemm import recipes
from fp8jax.metrics import paths
from fp8jax.rules import Rule, Rules
from fp8jax.study import sweep_report
from fp8jax.study.comparison import model_api, model_sweep


class TinyLM(nnx.Module):
  def __init__(self, rngs, vocab=32, dim=16, layers=2):
    self.embed = nnx.Embed(vocab, dim, rngs=rngs)
    self.blocks = nnx.List([nnx.Linear(dim, dim, rngs=rngs) for _ in range(layers)])
    self.head = nnx.Linear(dim, vocab, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    for block in self.blocks:
      x = x + jax.nn.gelu(block(x))
    return self.head(x)


TINY_CLASSIFIER = paths.Classifier.from_patterns(
    {"embed": r"^embed/", "block": r"^blocks/", "head": r"^head/"},
    layer=r"^blocks/(\d+)/", groups={"block": "blocks"})


def _rows(folder):
  return [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]


def test_classifier_from_patterns_groups_paths():
  assert TINY_CLASSIFIER.module_of("blocks/1/kernel") == "block"
  assert TINY_CLASSIFIER.layer_of("blocks/1/kernel") == 1
  assert TINY_CLASSIFIER.layer_of("head/kernel") is None
  assert TINY_CLASSIFIER.module_of("norm/scale") == "other"
  assert TINY_CLASSIFIER.group_of("block") == "blocks"
  with pytest.raises(ValueError, match="layer pattern"):
    paths.Classifier.from_patterns({"a": "a"}, layer=r"^blocks/\d+")
  with pytest.raises(ValueError, match="'a': bad regex"):
    paths.Classifier.from_patterns({"a": "("})


@pytest.mark.slow
def test_compare_grads_groups_by_the_models_classifier():
  g = {"blocks": {0: {"kernel": jnp.ones((2, 2))}, 1: {"kernel": jnp.ones((2, 2))}},
       "head": {"kernel": jnp.ones((2,))}}
  h = jax.tree.map(lambda x: 2 * x, g)
  res = metrics.compare_grads(g, h, classifier=TINY_CLASSIFIER,
                              direct=frozenset({("block", 1)}))
  assert set(res["by_module"]) == {"block", "head"}
  assert set(res["by_layer"]) == {"0", "1", "none"}
  assert set(res["by_group"]) == {"blocks", "other"}
  np.testing.assert_allclose(res["by_module"]["block"]["diff_norm"], np.sqrt(8), rtol=1e-6)
  np.testing.assert_allclose(res["direct"]["diff_norm_direct"], 2.0)
  assert len(res["per_expert"]) == 0


@pytest.mark.slow
def test_sweep_and_report_on_a_dense_nnx_model(tmp_path):
  model, params = model_api.nnx_model(TinyLM(nnx.Rngs(0)), TINY_CLASSIFIER)
  rules = Rules([Rule(r"blocks/\d+", recipes.recipe("fp8_tensor"))])
  variants = [model_api.Variant("blocks_fp8", rules, "blocks/*: fp8_tensor")]
  key = jax.random.key(1)
  batches = [jax.random.randint(jax.random.fold_in(key, i), (2, 8), 0, 32, jnp.int32)
             for i in range(2)]
  out = tmp_path / "compare"
  res = model_sweep.evaluate(model, out, variants, params, batches)
  assert res["rows_written"] == 4  # 2 batches x (policy + floor)
  rows = {(r["batch"], r["policy"]): r for r in _rows(out)}
  row = rows[(0, "blocks_fp8")]
  assert row["finite"] and 0 < row["rel_err"] < 1
  assert row["aux_loss_fp8"] == 0.0
  assert not any(k.startswith("routing/") for k in row)  # no MoE: no routing columns
  assert rows[(0, "floor")]["rel_err"] < row["rel_err"]
  assert model_sweep.evaluate(model, out, variants, params, batches)["rows_written"] == 0
  # TinyLM computes in FP32: its reference is FP32, read from the model, never "BF16".
  meta = json.loads((out / "meta.json").read_text())
  assert meta["reference"] == {"precision": "fp32", "gemm_share": {"fp32": 1.0}}
  assert row["loss_bf16"] == rows[(0, "floor")]["loss_bf16"]  # the column keeps its name
  path = sweep_report.write_report(out)
  text = path.read_text()
  assert "blocks_fp8" in text and "`blocks/*: fp8_tensor`" in text
  assert "Reference: FP32" in text and "the FP32 reference" in text
  assert not re.search(r"BF16 (reference|baseline|gradient|loss|pass)|g_bf16", text)


def test_a_rule_matching_nothing_is_refused(tmp_path):
  model, params = model_api.nnx_model(TinyLM(nnx.Rngs(0)), TINY_CLASSIFIER)
  bad = model_api.Variant("bad", Rules([Rule(r"blokcs/\d+", recipes.recipe("fp8_tensor"))]))
  with pytest.raises(ValueError, match="blokcs"):
    model_sweep.evaluate(model, tmp_path / "c", [bad], params, [jnp.zeros((2, 4), jnp.int32)])


@pytest.mark.slow
def test_canvit_from_its_package_quantized_by_rules(tmp_path, monkeypatch):
  canvit = pytest.importorskip("canvit_nnx")
  from canvit_core import backbone  # pylint: disable=import-outside-toplevel
  monkeypatch.setitem(backbone.BACKBONES, "tiny", backbone.ViTSpec(
      embed_dim=32, num_heads=2, num_blocks=2, patch_size=8))
  cfg = canvit.CanViTConfig(backbone_name="tiny", canvas_num_heads=2, canvas_head_dim=8,
                            num_canvas_registers=2, num_backbone_registers=1)
  net = canvit.CanViTForImageClassification(canvit_config=cfg, n_classes=10,
                                            rngs=nnx.Rngs(0))

  def call(module, batch):
    b = batch["images"].shape[0]
    state = module.init_state(batch_size=b, canvas_grid_size=2)
    return module(glimpse=batch["images"], state=state,
                  viewpoint=canvit.Viewpoint.full_scene(batch_size=b))[0]

  classifier = paths.Classifier.from_patterns(
      {"attn": r"/attn/", "mlp": r"/mlp/", "readout": r"^readout/"},
      layer=r"^canvit/backbone/blocks/(\d+)/")
  model, params = model_api.nnx_model(net, classifier, call=call, loss=model_api.label_loss)
  rules = Rules([Rule(r"canvit/backbone/blocks/\d+/mlp/fc\d", recipes.recipe("fp8_tensor"))])
  key = jax.random.key(0)
  batches = [{"images": jax.random.normal(jax.random.fold_in(key, i), (2, 16, 16, 3)),
              "labels": jnp.array([i, 3], jnp.int32)} for i in range(2)]
  out = tmp_path / "compare"
  model_sweep.evaluate(model, out, [model_api.Variant("mlp_fp8", rules)], params, batches)
  rows = {(r["batch"], r["policy"]): r for r in _rows(out)}
  assert len(rows) == 4
  assert rows[(0, "mlp_fp8")]["finite"] and rows[(0, "mlp_fp8")]["rel_err"] > 0
  details = [json.loads(line) for line in (out / "details.jsonl").read_text().splitlines()]
  assert any(k.startswith("mlp/") for k in details[0]["module_layer"])
  assert "mlp_fp8" in sweep_report.write_report(out).read_text()


@pytest.mark.slow
def test_sweep_on_a_linen_model_by_interception(tmp_path):
  import flax.linen as nn  # pylint: disable=import-outside-toplevel

  class LinenLM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
      x = nn.Embed(32, 16, name="embed")(tokens)
      for i in range(2):
        x = x + jax.nn.gelu(nn.Dense(16, name=f"blocks_{i}")(x))
      return nn.Dense(32, name="head")(x)

  classifier = paths.Classifier.from_patterns({"block": "^blocks_", "head": "^head/"},
                                              layer=r"^blocks_(\d+)/")
  tokens = jnp.zeros((2, 8), jnp.int32)
  net = LinenLM()
  model, params = model_api.linen_model(net, net.init(jax.random.key(0), tokens),
                                        classifier, tokens)
  rules = Rules([Rule(r"blocks_\d+", recipes.recipe("fp8_tensor"))])
  with pytest.raises(ValueError, match="blokcs"):
    model_sweep.evaluate(model, tmp_path / "bad", [model_api.Variant(
        "bad", Rules([Rule(r"blokcs_\d+", recipes.recipe("fp8_tensor"))]))], params, [tokens])
  batches = [jax.random.randint(jax.random.key(i), (2, 8), 0, 32, jnp.int32) for i in range(2)]
  out = tmp_path / "compare"
  model_sweep.evaluate(model, out, [model_api.Variant("fp8", rules)], params, batches)
  rows = {(r["batch"], r["policy"]): r for r in _rows(out)}
  assert rows[(1, "fp8")]["finite"] and 0 < rows[(1, "fp8")]["rel_err"] < 1
  details = [json.loads(line) for line in (out / "details.jsonl").read_text().splitlines()]
  assert set(details[0]["module_layer"]) == {"block/0", "block/1"}
