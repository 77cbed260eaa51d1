"""GPU check: cuDNN flash attention in the model against the XLA attention and float64.

    python scripts/gpu/check_attention.py      (with $OUT set: $OUT/check_attention.json)

A DeepSeek-MoE of 2 layers with head size 128 (the 2B and 16B head size) in bf16 compute,
once with multi-head attention (2 heads) and once with grouped-query attention (4 query
heads on 2 key/value heads; keys prefixed ``gqa/``), run with ``attention_impl="xla"`` and
``"cudnn"`` on the same params and tokens:

* logits of each against the float64 NumPy forward (``tests/references/reference_model.py``), as
  ||logits - ref|| / ||ref||: cuDNN must be no further from float64 than XLA (x1.5);
* the loss and the gradient of every parameter, cuDNN against XLA, as relative norms,
  beside XLA's own distance to a float32 run (the bf16 noise floor of the comparison).
"""

import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
import _repo  # noqa: E402,F401
import jax  # noqa: E402
import numpy as np  # noqa: E402

from fp8jax.models import config as mc  # noqa: E402
from fp8jax.models import deepseek_moe as dm  # noqa: E402
from tests.references import reference_model  # noqa: E402


def rel(a, b) -> float:
  """||a - b|| / ||b|| (0 when both are zero, e.g. the gradient of an unused expert)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  num, den = np.linalg.norm(a - b), np.linalg.norm(b)
  return float(num / den) if den else float(num)


def check(base) -> dict:
  """The measurements and the verdict ``ok`` for one model config."""
  tokens = jax.random.randint(jax.random.key(1), (2, 384), 0, base.vocab_size)
  params = dm.init(base.replace(dtype="float32"), jax.random.key(0))
  ref_logits, _ = reference_model.forward(params, np.asarray(tokens), base)
  out = {"head_dim": base.head_dim, "heads": base.num_attention_heads,
         "kv_heads": base.kv_heads}
  grads, logits = {}, {}
  for impl, dtype in (("xla", "bfloat16"), ("cudnn", "bfloat16"), ("xla", "float32")):
    cfg = base.replace(attention_impl=impl, dtype=dtype)

    def loss(p, cfg=cfg):
      lg, aux = dm.apply(p, tokens, cfg)
      return dm.lm_loss(lg, tokens) + aux["aux_loss"], lg

    with jax.default_matmul_precision("highest" if dtype == "float32" else "default"):
      (val, lg), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    key = f"{impl}_{dtype}"
    grads[key], logits[key] = g, lg
    out[f"{key}/loss"] = float(val)
    out[f"{key}/logits_vs_float64"] = rel(lg, ref_logits)
  leaves = lambda t: jax.tree.leaves(t)  # noqa: E731
  for a, b in (("cudnn_bfloat16", "xla_bfloat16"), ("xla_bfloat16", "xla_float32"),
               ("cudnn_bfloat16", "xla_float32")):
    out[f"grad_rel/{a}_vs_{b}"] = max(rel(x, y) for x, y in zip(leaves(grads[a]),
                                                                leaves(grads[b])))
  ok = out["cudnn_bfloat16/logits_vs_float64"] <= 1.5 * out["xla_bfloat16/logits_vs_float64"]
  ok &= out["grad_rel/cudnn_bfloat16_vs_xla_float32"] <= 1.5 * out[
      "grad_rel/xla_bfloat16_vs_xla_float32"]
  out["ok"] = bool(ok)
  return out


def main():
  mha = mc.tiny(hidden_size=256, num_attention_heads=2, num_hidden_layers=2,
                max_position_embeddings=512)
  gqa = mha.replace(hidden_size=512, num_attention_heads=4, num_key_value_heads=2)
  out = {"device": jax.devices()[0].device_kind}
  out.update(check(mha))
  out.update({f"gqa/{k}": v for k, v in check(gqa).items()})
  out["ok"] = out["ok"] and out["gqa/ok"]
  for k, v in out.items():
    print(f"{k}: {v}")
  if os.environ.get("OUT"):
    pathlib.Path(os.environ["OUT"], "check_attention.json").write_text(json.dumps(out, indent=1))
  sys.exit(0 if out["ok"] else 1)


if __name__ == "__main__":
  main()
