"""Params-only checkpoints: the optimizer state kept by the newest checkpoint only.

A full 2B checkpoint (FP32 params and two AdamW moments) is three times its params; a
run that keeps many checkpoints for the precision studies (which read only the params)
need not keep every optimizer state. Under ``train.full_state="last"``
(:mod:`fp8jax.train.run_config`) a checkpoint is saved as two Orbax items:

* ``state``: the train state without its optimizer state (params, step, delayed-scaling
  and loss-scaling state), its params in ``train.checkpoint_params_dtype`` when set
  (``"bfloat16"``: half the bytes of FP32 params);
* ``optimizer`` (:data:`ITEM`): ``{"opt_state": ..., "master_params": params}``, the
  master params only when the ``state`` item's params were cast.

When a newer checkpoint has been saved, the older checkpoints' ``optimizer`` items are
dropped (:func:`drop`: renamed to ``optimizer.dropped``, then deleted), except at the steps
of ``train.full_state_steps``. Nothing already written is lost: a drop happens only
after the newer checkpoint is finalized by Orbax, flushed to disk (:func:`flush`) and
checked (:func:`problem`: its optimizer item is committed and lists every optimizer
array, shape-free, that its ``meta`` digests record). Its arrays' digests are checked
when it is read back, as for every checkpoint. A kill during a drop leaves either the
item or its renamed copy, which the next drop deletes.

The digests in ``meta`` cover both items (paths ``params/...``, ``opt_state/...``,
``master_params/...``), so ``verify`` and the params-only restore of ``compare`` work on
checkpoints with or without their optimizer state. Resume and ``branch`` need it: from a
params-only checkpoint they fail with :class:`ParamsOnlyCheckpointError`.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from fp8jax.train import checkpoint_digest

MODES = ("all", "last")
"""``train.full_state``: every checkpoint keeps the optimizer state, or the newest only."""
PARAMS_DTYPES = ("", "bfloat16")
"""``train.checkpoint_params_dtype``: "" keeps the params' own dtype."""
ITEM = "optimizer"
"""The Orbax item that holds the optimizer state (and the master params)."""
META = "full_state"
"""The meta key of a checkpoint saved in two items: ``{"item": ITEM, "master_params": bool}``."""
MASTER = "master_params"
OPT = "opt_state"
_DROPPED = ".dropped"


class ParamsOnlyCheckpointError(ValueError):
  """A resume or branch from a checkpoint whose optimizer state was dropped."""


def split(stored, params_dtype: str = "") -> tuple[dict, dict]:
  """(``state`` item, ``optimizer`` item) of a stored train state (a NamedTuple or dict,
  ``checkpoint._stored``); the state item's params cast to ``params_dtype`` (if set and
  other than theirs), the full-precision params then kept in the optimizer item."""
  state = dict(stored._asdict() if hasattr(stored, "_asdict") else stored)
  optimizer = {OPT: state.pop(OPT)}
  if params_dtype and any(x.dtype != jnp.dtype(params_dtype)
                          for x in jax.tree.leaves(state["params"])):
    optimizer[MASTER] = state["params"]
    state["params"] = jax.tree.map(lambda x: _cast(x, params_dtype), state["params"])
  return state, optimizer


def _cast(x, dtype: str):
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype), sharding=x.sharding)
  return x.astype(dtype)


def join(tree: dict, like=None):
  """The state restored from both items: the master params, if saved, as the params; of
  ``like``'s type (a stored train state) when the optimizer state is there, else a dict."""
  tree = dict(tree)
  if MASTER in tree:
    tree["params"] = tree.pop(MASTER)
  if OPT in tree and like is not None and not isinstance(like, dict):
    return type(like)(**tree)
  return tree


def restore_target(stored_target, meta: dict) -> dict:
  """The abstract tree as saved in two items (``stored_target``: the stored train state's
  shapes): the optimizer state, and the master params if the save cast the params."""
  held, opt = split(stored_target)
  if meta[META].get("master_params"):
    opt[MASTER] = held["params"]
  return {**held, **opt}


def restore_args(target: dict, meta: dict, step_dir: pathlib.Path) -> ocp.args.Composite:
  """The Orbax restore of both items (of ``state`` alone when the optimizer item was
  dropped) and of the data position, for :func:`restore_target`'s ``target``."""
  items = {"state": {k: v for k, v in target.items() if k not in (OPT, MASTER)}}
  if has_optimizer(step_dir, meta):
    items[ITEM] = {k: v for k, v in target.items() if k in (OPT, MASTER)}
  return ocp.args.Composite(data=ocp.args.JsonRestore(),
                            **{k: ocp.args.StandardRestore(v) for k, v in items.items()})


def has_optimizer(step_dir: pathlib.Path, meta: dict) -> bool:
  """Whether the checkpoint in ``step_dir`` (its ``meta`` item) keeps its optimizer state."""
  return META not in meta or (pathlib.Path(step_dir) / ITEM).is_dir()


def flush(step_dir: pathlib.Path) -> None:
  """Writes every file and folder of ``step_dir`` through to the disk (fsync)."""
  for root, dirs, files in os.walk(step_dir):
    for name in files + dirs + ["."]:
      flush_dir(os.path.join(root, name))


def problem(step_dir: pathlib.Path, meta: dict) -> str | None:
  """Why the optimizer item in ``step_dir`` cannot stand for the run's state, or None: it
  must be committed and list every optimizer (and master) array its meta records, in the
  recorded dtype."""
  item = pathlib.Path(step_dir) / ITEM
  if not (item / "commit_success.txt").exists():
    return f"{item} is not a committed Orbax item"
  recorded = (meta.get("digests") or {}).get("dtypes", {})
  want = {p: d for p, d in recorded.items() if p.split("/")[0] in (OPT, MASTER)}
  try:
    tree = ocp.StandardCheckpointHandler().metadata(item).tree
  except Exception as e:  # pylint: disable=broad-except
    return f"{item}: its metadata does not read ({checkpoint_digest.short_error(e)})"
  found = {checkpoint_digest.leaf_path(p): str(m.dtype)
           for p, m in jax.tree_util.tree_flatten_with_path(tree)[0] if hasattr(m, "dtype")}
  missing = sorted(p for p, d in want.items() if found.get(p) != d)
  if not want or missing:
    return f"{item} lacks {missing[:3] or 'the recorded optimizer arrays'}"
  return None


def drop(step_dir: pathlib.Path) -> None:
  """Deletes the optimizer item of ``step_dir``: renamed first (a kill leaves a folder
  that no restore reads), then deleted with any earlier leftover."""
  step_dir = pathlib.Path(step_dir)
  item, gone = step_dir / ITEM, step_dir / (ITEM + _DROPPED)
  if item.is_dir():
    if gone.exists():
      shutil.rmtree(gone)
    item.rename(gone)
    flush_dir(step_dir)
  if gone.exists():
    shutil.rmtree(gone)


def flush_dir(path) -> None:
  """fsync of one file or folder (a folder: the names in it)."""
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def drop_superseded(paths: dict, metas: dict, keep) -> None:
  """Drops the optimizer items of the checkpoints (``{step: folder}``, ``{step: meta}``)
  older than the newest one that keeps its optimizer state, once that one is flushed and
  checked (:func:`problem`; else warns and drops nothing); not at the ``keep`` steps."""
  full = [s for s in sorted(paths) if has_optimizer(paths[s], metas[s])]
  if not full or META not in metas[full[-1]]:
    return
  flush(paths[full[-1]])
  if (why := problem(paths[full[-1]], metas[full[-1]])) is not None:
    print(f"warning: kept the older optimizer states: {why}", file=sys.stderr)
    return
  for s in paths:
    if s < full[-1] and s not in keep and META in metas[s]:
      drop(paths[s])


def refusal(directory: pathlib.Path, steps: list[int], full: list[int],
            what: str) -> ParamsOnlyCheckpointError:
  """The one-line error of ``what`` (a resume, a branch) from the params-only ``steps``."""
  said = (f"the checkpoint at step {steps[0]} in {directory} holds" if len(steps) == 1 else
          f"the checkpoints at steps {steps} in {directory} hold")
  return ParamsOnlyCheckpointError(
      f"{what} needs the optimizer state, but {said} params only (dropped under "
      f"train.full_state='last' when a newer checkpoint was saved); checkpoints with it: "
      f"{f'steps {full}' if full else 'none'} (train.full_state_steps keeps more)")
