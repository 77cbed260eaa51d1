r"""Convert HF DeepSeek-MoE (v1) checkpoints to an fp8jax Orbax params checkpoint and back.

  # HF directory (config.json + *.safetensors [+ index]) -> OUT/params (Orbax) + OUT/config.json
  python -m fp8jax.experiments.convert_hf --hf_dir=/ckpt/deepseek-moe-16b-base --out=/ckpt/16b
  # ... with exact zero-padding of the expert width (853 -> 864 for the 2B model)
  python -m fp8jax.experiments.convert_hf --hf_dir=... --out=... --expert_pad_to=864
  # back to HF safetensors (bf16)
  python -m fp8jax.experiments.convert_hf --reverse --out=/ckpt/16b --hf_dir=/tmp/hf_again

The forward direction streams: the HF tensors are memory-mapped, and the params are
written as one Orbax checkpoint per group (``params/base`` for the embedding, final norm
and head, ``params/layer_NNN`` for each decoder layer), so memory holds one layer at a
time, not the model. :func:`load_params` reassembles the tree.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

from absl import app, flags
import ml_dtypes
import orbax.checkpoint as ocp

from fp8jax.models import deepseek_moe, hf_convert
from fp8jax.models.config import ModelConfig

_HF_DIR = flags.DEFINE_string("hf_dir", None, "HF checkpoint directory (input, or output "
                              "with --reverse).", required=True)
_OUT = flags.DEFINE_string("out", None, "fp8jax checkpoint directory.", required=True)
_REVERSE = flags.DEFINE_bool("reverse", False, "Export OUT back to HF format in HF_DIR.")
_PAD = flags.DEFINE_integer("expert_pad_to", None, "Zero-pad the expert width to this.")
_PARAM_DTYPE = flags.DEFINE_string("param_dtype", "float32", "Stored parameter dtype.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing output.")


def _refuse_existing(path: pathlib.Path, overwrite: bool) -> None:
  if path.exists() and any(path.iterdir()) and not overwrite:
    raise FileExistsError(f"{path} exists and is not empty; pass --overwrite to replace it")


def hf_to_orbax(hf_dir, out, *, expert_pad_to=None, param_dtype="float32",
                overwrite=False) -> ModelConfig:
  """Validates and converts an HF checkpoint; returns the model config."""
  hf_dir, out = pathlib.Path(hf_dir), pathlib.Path(out)
  _refuse_existing(out, overwrite)
  cfg = hf_convert.config_from_hf(json.loads((hf_dir / "config.json").read_text()),
                                  expert_pad_to=expert_pad_to, param_dtype=param_dtype)
  ckpt = hf_convert.HFCheckpoint(hf_dir)
  ckpt.validate(cfg)
  if out.exists() and overwrite:
    shutil.rmtree(out)
  out.mkdir(parents=True, exist_ok=True)
  checkpointer = ocp.StandardCheckpointer()
  group, tree = None, {}

  def flush():
    if tree:
      checkpointer.save(out / "params" / group, tree)
      checkpointer.wait_until_finished()
      tree.clear()

  for path, build in hf_convert.param_builders(cfg, ckpt):
    name = f"layer_{path[1]:03d}" if path[0] == "layers" else "base"
    if name != group:
      flush()
      group = name
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = build().astype(param_dtype)
  flush()
  (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1))
  return cfg


def load_params(out) -> tuple[ModelConfig, dict]:
  """Restores (config, params) written by :func:`hf_to_orbax`."""
  out = pathlib.Path(out)
  cfg = ModelConfig(**json.loads((out / "config.json").read_text()))
  abstract = deepseek_moe.abstract_params(cfg)
  checkpointer = ocp.StandardCheckpointer()
  params = checkpointer.restore(out / "params" / "base",
                                {k: v for k, v in abstract.items() if k != "layers"})
  params["layers"] = {}
  for i, layer in abstract["layers"].items():
    restored = checkpointer.restore(out / "params" / f"layer_{i:03d}", {"layers": {i: layer}})
    params["layers"][i] = restored["layers"][i]
  return cfg, params


def orbax_to_hf(out, hf_dir, *, overwrite=False) -> None:
  """Exports a converted checkpoint back to HF safetensors (bf16)."""
  hf_dir = pathlib.Path(hf_dir)
  _refuse_existing(hf_dir, overwrite)
  cfg, params = load_params(out)
  hf_convert.params_to_hf(cfg, params, hf_dir, dtype=ml_dtypes.bfloat16)


def main(argv):
  del argv
  if _REVERSE.value:
    orbax_to_hf(_OUT.value, _HF_DIR.value, overwrite=_OVERWRITE.value)
    print(f"wrote HF checkpoint to {_HF_DIR.value}")
  else:
    cfg = hf_to_orbax(_HF_DIR.value, _OUT.value, expert_pad_to=_PAD.value,
                      param_dtype=_PARAM_DTYPE.value, overwrite=_OVERWRITE.value)
    print(f"wrote {_OUT.value}/params and config.json ({cfg.num_hidden_layers} layers)")


if __name__ == "__main__":
  app.run(main)
