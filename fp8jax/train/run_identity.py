"""The identity of a training run, so that a checkpoint copied in from another run is
recognised: ``<workdir>/run.json``, written when the run starts.

    identity = create(workdir, cfg, data)  # {"id", "seed", "model", "policy", "data",
    identity == read(workdir)                #  "created"}

``data`` is the data's id (:func:`fp8jax.data.pipeline.data_id`: the source, its files or
manifest and the tokenizer, digested), the same that each checkpoint's data position
records. Every checkpoint records its run's identity in its meta (``meta["run"]``,
:class:`fp8jax.train.checkpoint.Checkpointer` reads it from the folder above its
checkpoints); a restore, ``verify`` or ``compare`` of a checkpoint whose recorded ``id`` is
not its workdir's finds it :class:`~fp8jax.train.checkpoint_digest.Foreign`. Runs (and
checkpoints) from before identities existed have none and are not checked.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import uuid

FILE = "run.json"


def create(workdir, cfg, data: str | None = None) -> dict:
  """A new identity for the run starting in ``workdir`` on the data named ``data`` (written
  atomically; any earlier one, of a run that saved nothing, replaced)."""
  identity = {"id": uuid.uuid4().hex, "seed": int(cfg.seed), "model": str(cfg.model),
              "policy": str(cfg.policy), "data": data,
              "created": datetime.datetime.now(datetime.UTC).isoformat(
                  timespec="seconds")}
  path = pathlib.Path(workdir) / FILE
  tmp = path.with_name(FILE + ".tmp")
  tmp.write_text(json.dumps(identity, indent=1))
  tmp.replace(path)
  return identity


def read(workdir) -> dict | None:
  """The identity of the run in ``workdir``; None if it has none (an earlier version's
  run) or the file does not read as one."""
  path = pathlib.Path(workdir) / FILE
  try:
    identity = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  return identity if isinstance(identity, dict) and "id" in identity else None


def describe(identity: dict) -> str:
  """``run 1a2b3c4d (seed 0, policy bf16)``."""
  return (f"run {str(identity.get('id'))[:8]} (seed {identity.get('seed')}, policy "
          f"{identity.get('policy')})")
