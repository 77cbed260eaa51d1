"""Which part of the model fails or is non-deterministic under XLA's deterministic ops?

    python scripts/gpu/det_probe.py [--json=OUT.json]

For each variant (attention "cudnn" or "xla", MoE "pallas" or "dispatch"), a subprocess
with ``XLA_FLAGS=--xla_gpu_deterministic_ops=true`` (and one without) takes the gradient of
a 1-layer DeepSeek-MoE at the 2B widths on 2 x 512 tokens twice, and reports whether it
compiled, and whether the two gradients (and a third call's) are bit-identical.
"""

import json
import os
import subprocess
import sys

CHILD = r'''
import json, sys
sys.path.insert(0, "scripts/bench")
import _repo  # noqa
import jax, jax.numpy as jnp, numpy as np
from fp8jax.models import config, deepseek_moe as dm
attn, moe = sys.argv[1], sys.argv[2]
cfg = config.get_config("deepseek_moe_2b", num_hidden_layers=1, first_k_dense_replace=0,
                        expert_pad_to=896, attention_impl=attn)
params = dm.init(cfg, jax.random.key(0))
tokens = jax.random.randint(jax.random.key(1), (2, 512), 0, cfg.vocab_size)
def loss(p):
  lg, aux = dm.apply(p, tokens, cfg, moe_impl=moe)
  return dm.lm_loss(lg, tokens) + aux["aux_loss"]
f = jax.jit(jax.grad(loss))
out = {}
try:
  gs = [jax.device_get(f(params)) for _ in range(3)]
except Exception as e:
  print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"})); sys.exit()
leaves = [jax.tree.leaves(g) for g in gs]
same = all(all(np.array_equal(a, b) for a, b in zip(leaves[0], l)) for l in leaves[1:])
diff = [k for k, (a, b) in enumerate(zip(leaves[0], leaves[1])) if not np.array_equal(a, b)]
paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(gs[0])[0]]
print(json.dumps({"ok": True, "same": same, "differ": [paths[k] for k in diff][:8]}))
'''


def main():
  results = {}
  for det in (True, False):
    for attn in ("cudnn", "xla"):
      for moe in ("pallas", "dispatch"):
        if not det and attn == "xla":
          continue
        env = dict(os.environ)
        env["XLA_FLAGS"] = "--xla_gpu_deterministic_ops=true" if det else ""
        p = subprocess.run([sys.executable, "-c", CHILD, attn, moe], env=env,
                           capture_output=True, text=True, timeout=240)
        last = (p.stdout.strip().splitlines() or ['{"ok": false}'])[-1]
        try:
          res = json.loads(last)
        except json.JSONDecodeError:
          res = {"ok": False, "error": p.stderr[-400:]}
        key = f"{'det' if det else 'default'}/attn={attn}/moe={moe}"
        results[key] = res
        print(key, json.dumps(res), flush=True)
  out = [a[len("--json="):] for a in sys.argv[1:] if a.startswith("--json=")]
  if out:
    with open(out[0], "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
