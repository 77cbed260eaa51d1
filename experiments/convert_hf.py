r"""Convert HF DeepSeek-MoE (v1) checkpoints to an fp8jax Orbax params checkpoint and back.

  # HF directory (config.json + *.safetensors [+ index]) -> OUT/params (Orbax) + OUT/config.json
  python -m fp8jax.experiments.convert_hf --hf_dir=/ckpt/deepseek-moe-16b-base --out=/ckpt/16b
  # ... with exact zero-padding of the expert width (853 -> 896 for the 2B model; the
  # Mosaic GPU grouped GEMMs need a multiple of 128)
  python -m fp8jax.experiments.convert_hf --hf_dir=... --out=... --expert_pad_to=896
  # back to HF safetensors (bf16)
  python -m fp8jax.experiments.convert_hf --reverse --out=/ckpt/16b --hf_dir=/tmp/hf_again

Streams layer by layer (see ``fp8jax.train.params_io``). ``OUT/meta.json`` records the
name, size and SHA-256 of every source file and a digest of every converted array;
``--reverse`` verifies the arrays it reads against those digests.
"""

from __future__ import annotations

import sys

from absl import flags

from fp8jax.experiments import _cli
from fp8jax.train import multihost
from fp8jax.train.params_io import hf_to_orbax, orbax_to_hf

_HF_DIR = flags.DEFINE_string("hf_dir", None, "HF checkpoint directory (input, or output "
                              "with --reverse).", required=True)
_OUT = flags.DEFINE_string("out", None, "fp8jax checkpoint directory.", required=True)
_REVERSE = flags.DEFINE_bool("reverse", False, "Export OUT back to HF format in HF_DIR.")
_PAD = flags.DEFINE_integer("expert_pad_to", None, "Zero-pad the expert width to this.")
_PARAM_DTYPE = flags.DEFINE_string("param_dtype", "float32", "Stored parameter dtype.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing output.")


def main(argv):
  del argv
  multihost.quiet_library_logs(flags.FLAGS["verbosity"].present)
  try:
    if _REVERSE.value:
      orbax_to_hf(_OUT.value, _HF_DIR.value, overwrite=_OVERWRITE.value)
      print(f"wrote HF checkpoint to {_HF_DIR.value}")
    else:
      cfg = hf_to_orbax(_HF_DIR.value, _OUT.value, expert_pad_to=_PAD.value,
                        param_dtype=_PARAM_DTYPE.value, overwrite=_OVERWRITE.value)
      print(f"wrote {_OUT.value}/params, config.json and meta.json "
            f"({cfg.num_hidden_layers} layers)")
  except (ValueError, FileNotFoundError, FileExistsError) as e:
    print(f"error: {e}", file=sys.stderr)  # bad input, or a corrupt converted checkpoint
    return 2
  return 0


if __name__ == "__main__":
  _cli.run(main)
