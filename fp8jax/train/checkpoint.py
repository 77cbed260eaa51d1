"""Training checkpoints with Orbax: state, data position, config and code version.

Saved at step 0 and every ``save_every`` steps, asynchronously, keeping every checkpoint
by default (the precision studies evaluate each one). Orbax finalises a step atomically,
so a killed run leaves no partial checkpoint behind.
"""

from __future__ import annotations

import pathlib
import subprocess

import jax
import orbax.checkpoint as ocp

import fp8jax


def code_version() -> str:
  """``git describe`` of the source tree if available, else the package version."""
  repo = pathlib.Path(fp8jax.__file__).resolve().parents[1]
  try:
    out = subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty"],
                         capture_output=True, text=True, timeout=10, check=True)
    return out.stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return f"fp8jax {fp8jax.__version__}"


class Checkpointer:
  """An Orbax CheckpointManager with the items a training run needs."""

  def __init__(self, directory, save_every: int, max_to_keep: int | None = None):
    if save_every < 1:
      raise ValueError(f"save_every must be >= 1, got {save_every}")
    options = ocp.CheckpointManagerOptions(save_interval_steps=save_every,
                                           max_to_keep=max_to_keep, create=True)
    self.manager = ocp.CheckpointManager(pathlib.Path(directory).resolve(), options=options)

  def save(self, step: int, state, data_position: dict, meta: dict, force: bool = False):
    """Saves (if the step is due or ``force``): returns whether a save started."""
    return self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_position),
        meta=ocp.args.JsonSave({**meta, "code_version": code_version()})), force=force)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def restore(self, step: int, abstract_state):
    """(state, data position, meta) of ``step``; ``abstract_state`` gives shapes,
    dtypes and (optionally) shardings."""
    out = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(),
        meta=ocp.args.JsonRestore()))
    return out.state, out.data, out.meta

  def restore_params(self, step: int, abstract_params):
    """(params, meta) of ``step`` without the optimizer state (a partial restore);
    ``abstract_params`` gives shapes, dtypes and shardings."""
    restore_args = jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding),
                                abstract_params)
    out = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(item={"params": abstract_params},
                                     restore_args={"params": restore_args},
                                     partial_restore=True),
        meta=ocp.args.JsonRestore()))
    return out.state["params"], out.meta

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.close()


def abstract_like(tree):
  """ShapeDtypeStructs (with shardings where known) for restoring into ``tree``'s layout."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
