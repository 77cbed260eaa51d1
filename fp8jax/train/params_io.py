"""Converted checkpoints on disk: HF directory -> Orbax params (by layer group) and back.

``hf_to_orbax`` streams: the HF tensors are memory-mapped, and the params are written as
one Orbax checkpoint per group (``params/base`` for the embedding, final norm and head,
``params/layer_NNN`` for each decoder layer), so memory holds one layer at a time, not the
model. :func:`load_params` reassembles the tree. Existing outputs are never overwritten
unless asked.

``OUT/meta.json`` traces a conversion to its source and guards its result: the name,
size and SHA-256 of every source file (``config.json`` and the ``*.safetensors``), and a
digest of every converted array (:mod:`fp8jax.train.checkpoint_digest`), which
:func:`load_params` (and so the conversion back to HF) verifies.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

import ml_dtypes
import orbax.checkpoint as ocp

from fp8jax.models import deepseek_moe, hf_convert
from fp8jax.models.config import ModelConfig
from fp8jax.train import checkpoint_digest


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
  group, tree, digests = None, {}, {"algorithm": checkpoint_digest.ALGORITHM, "arrays": {},
                                     "dtypes": {}}

  def flush():
    if tree:
      recorded = checkpoint_digest.record(tree)
      digests["arrays"].update(recorded["arrays"])
      digests["dtypes"].update(recorded["dtypes"])
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
  sources = [hf_dir / "config.json", *sorted(hf_dir.glob("*.safetensors"))]
  meta = {"source": {"hf_dir": str(hf_dir.resolve()),
                     "files": [{"name": f.name, "bytes": f.stat().st_size,
                                "sha256": checkpoint_digest.file_sha256(f)} for f in sources]},
          "digests": digests}
  tmp = out / "meta.json.tmp"
  tmp.write_text(json.dumps(meta, indent=1))
  tmp.replace(out / "meta.json")  # last: a conversion cut short has no meta.json
  return cfg


def load_params(out) -> tuple[ModelConfig, dict]:
  """Restores (config, params) written by :func:`hf_to_orbax`, verified against the
  digests of ``meta.json`` (:func:`fp8jax.train.checkpoint_digest.check`: an error for a corrupt
  or unreadable array, a warning for a conversion without ``meta.json``)."""
  out = pathlib.Path(out)
  cfg = ModelConfig(**json.loads((out / "config.json").read_text()))
  abstract = deepseek_moe.abstract_params(cfg)
  meta_path = out / "meta.json"
  recorded = json.loads(meta_path.read_text())["digests"] if meta_path.exists() else None
  checkpointer = ocp.StandardCheckpointer()
  try:
    params = checkpointer.restore(out / "params" / "base",
                                  {k: v for k, v in abstract.items() if k != "layers"})
    params["layers"] = {}
    for i, layer in abstract["layers"].items():
      restored = checkpointer.restore(out / "params" / f"layer_{i:03d}",
                                      {"layers": {i: layer}})
      params["layers"][i] = restored["layers"][i]
  except Exception as e:  # pylint: disable=broad-except
    raise checkpoint_digest.IncompleteCheckpointError(
        checkpoint_digest.Incomplete(str(out / "params"), checkpoint_digest.short_error(e))) from e
  checkpoint_digest.check(checkpoint_digest.verify_tree(str(out / "params"), params, recorded))
  return cfg, params


def orbax_to_hf(out, hf_dir, *, overwrite=False) -> None:
  """Exports a converted checkpoint back to HF safetensors (bf16)."""
  hf_dir = pathlib.Path(hf_dir)
  _refuse_existing(hf_dir, overwrite)
  cfg, params = load_params(out)
  hf_convert.params_to_hf(cfg, params, hf_dir, dtype=ml_dtypes.bfloat16)
