"""Peak memory of the HF -> Orbax conversion on a synthetic many-shard checkpoint.

Writes a random bf16 HF checkpoint (default ~1 GB in 24 shards), converts it in a child
process and prints the child's peak resident memory next to the checkpoint size:

  .venv/bin/python scripts/measure_convert_memory.py [--layers 8 --experts 32 ...]
"""

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

from fp8jax.models import config as mc
from fp8jax.models import hf_convert
from fp8jax.models import safetensors_io as st


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--hidden", type=int, default=1024)
  ap.add_argument("--experts", type=int, default=32)
  ap.add_argument("--expert_width", type=int, default=512)
  ap.add_argument("--vocab", type=int, default=16384)
  ap.add_argument("--shards", type=int, default=24)
  args = ap.parse_args()
  cfg = mc.ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                       num_hidden_layers=args.layers, num_attention_heads=args.hidden // 128,
                       intermediate_size=4 * args.hidden,
                       moe_intermediate_size=args.expert_width, n_routed_experts=args.experts,
                       n_shared_experts=1, num_experts_per_tok=4, first_k_dense_replace=1)
  work = pathlib.Path(tempfile.mkdtemp())
  hf = work / "hf"
  hf.mkdir()
  shapes = list(hf_convert.hf_tensor_shapes(cfg).items())
  rng = np.random.default_rng(0)
  per = -(-len(shapes) // args.shards)
  for n in range(0, len(shapes), per):
    st.write(hf / f"model-{n // per:05d}.safetensors",
             [(k, s, ml_dtypes.bfloat16) for k, s in shapes[n:n + per]],
             lambda name: (rng.standard_normal(dict(shapes)[name], np.float32) * 0.02))
  (hf / "config.json").write_text(json.dumps(hf_convert.config_to_hf(cfg)))
  size = sum(p.stat().st_size for p in hf.glob("*.safetensors"))
  start = time.time()
  subprocess.run([sys.executable, "-m", "fp8jax.experiments.convert_hf", f"--hf_dir={hf}",
                  f"--out={work / 'out'}"], check=True, capture_output=True)
  peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
  largest = max(int(np.prod(s)) for _, s in shapes) * 4
  stacked = args.experts * args.hidden * args.expert_width * 4
  print(f"checkpoint {size / 2**30:.2f} GiB bf16 in {len(list(hf.glob('*.safetensors')))} "
        f"shards, {len(shapes)} tensors; converted to float32 "
        f"({2 * size / 2**30:.2f} GiB) in {time.time() - start:.0f} s")
  print(f"peak RSS of the converter: {peak / 2**30:.2f} GiB; largest stacked expert tensor "
        f"{stacked / 2**30:.2f} GiB, largest HF tensor {largest / 2**30:.3f} GiB (float32)")


if __name__ == "__main__":
  main()
