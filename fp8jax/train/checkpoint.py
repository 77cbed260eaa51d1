"""Training checkpoints with Orbax: state, data position, config, code version, digests.

Saved at step 0 and every ``save_every`` steps, asynchronously, keeping every checkpoint
by default (the precision studies evaluate each one). Orbax finalises a step atomically,
so a killed run leaves no partial checkpoint behind. The ``meta`` item records a digest
of every saved array (:func:`fp8jax.train.checkpoint_digest.record`), and every restore verifies
the arrays it read against them: a file damaged later (a bad copy between machines, a
disk error) that still decodes is caught as well as one that does not restore.

In a multi-process run every process saves its own data position (the ``positions`` item,
:mod:`fp8jax.train.data_positions`) and restores its own; a checkpoint that does not
restore on one process is incomplete for all of them. The digests in ``meta`` cover the
data positions too (``digests["positions"]``): every restore and verification checks each
positions file, and the copy of process 0's position in the ``data`` item, against them,
so an edited or damaged position is a corrupt checkpoint, named by its file.

A train state's delayed-scaling state (its ``delayed`` field: per-site amax histories,
:mod:`fp8jax.models.delayed_sites`) is saved with it and its layout recorded in ``meta``
(``delayed_state``: ``{"site/layer/fwd": shape}``); a restore into a state that expects
another layout fails with :class:`DelayedStateMismatchError` naming both. An empty one (a
policy without delayed scaling) is left out, so such checkpoints keep the layout of
earlier versions and those load as before. The same holds for the dynamic loss-scaling
state (the ``loss_scale`` field, :mod:`fp8jax.train.loss_scale`; ``{}`` when off).

A state whose decoder layers are stored stacked (``train.scan_layers``,
:mod:`fp8jax.models.layer_stack`) is saved as it is, its runs recorded in ``meta``
(:data:`LAYER_RUNS`); a restore into a state (or params) laid out otherwise, per layer or
in other runs, restores the saved layout, verifies it, and restacks it: checkpoints of
either layout load into either.

The training loop records the run's precision policy in every checkpoint's meta
(:data:`POLICY`: ``fp8jax.models.policy.record``, epsilons included); :func:`saved_policy`
reads it back (None for checkpoints written before it existed). A resume under another
policy raises :class:`PolicyMismatchError` unless allowed (``fp8jax.train.loop.train``).
:class:`NoCheckpointer` stands in for a :class:`Checkpointer` in a run without checkpoints.

``full_state="last"`` keeps the optimizer state in the newest checkpoint only (and at
``keep_full`` steps), the others holding the params only: :mod:`fp8jax.train.full_state`.
"""

from __future__ import annotations

import pathlib
import subprocess

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

import fp8jax
from fp8jax.models import delayed_sites, layer_stack
from fp8jax.train import checkpoint_digest, data_positions, faults, multihost, run_identity
from fp8jax.train import full_state as full_state_lib
from fp8jax.train.orbax_errors import disk_errors, quiet_closed_loop_callbacks

ParamsOnlyCheckpointError = full_state_lib.ParamsOnlyCheckpointError

DELAYED = "delayed"
"""The train-state field that holds the delayed-scaling state."""
OPTIONAL = (DELAYED, "loss_scale")
"""Train-state fields left out of a checkpoint when empty (earlier versions lacked them)."""
LAYER_RUNS = "layer_runs"
"""The meta key of the stored runs of a state whose layers are stored stacked
(:mod:`fp8jax.models.layer_stack`); absent: per layer."""
RUN = "run"
"""The meta key of the identity of the run that saved the checkpoint
(:mod:`fp8jax.train.run_identity`)."""
POLICY, POLICY_RECORD = "precision_policy", "policy_record"
"""Meta keys: the run's ``fp8jax.models.policy.record``, its ``fp8jax.models.policy_record``."""


class DelayedStateMismatchError(ValueError):
  """A checkpoint's delayed-scaling state does not have the layout the restore expects."""


class PolicyMismatchError(ValueError):
  """A resume or branch under another precision policy than its checkpoint records."""


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
  """An Orbax CheckpointManager with the items a training run needs.

  Saves record a digest of every array (``digests=False`` only to measure their cost);
  restores verify the arrays they read against them (see :mod:`fp8jax.train.checkpoint_digest`)
  and raise :class:`~fp8jax.train.checkpoint_digest.CorruptCheckpointError` or
  :class:`~fp8jax.train.checkpoint_digest.IncompleteCheckpointError`, or warn for a checkpoint
  written before digests existed. ``full_state``, ``keep_full`` (steps) and
  ``params_dtype``: :mod:`fp8jax.train.full_state` (``"all"``: every checkpoint whole).
  """

  def __init__(self, directory, save_every: int, max_to_keep: int | None = None,
               digests: bool = True, full_state: str = "all", keep_full=(),
               params_dtype: str = ""):
    if save_every < 1:
      raise ValueError(f"save_every must be >= 1, got {save_every}")
    if full_state not in full_state_lib.MODES:
      raise ValueError(f"full_state must be one of {full_state_lib.MODES}, got {full_state!r}")
    self.full_state, self.keep_full = full_state, {int(s) for s in keep_full}
    self.params_dtype = params_dtype
    options = ocp.CheckpointManagerOptions(save_interval_steps=save_every,
                                           max_to_keep=max_to_keep, create=True)
    self.manager = ocp.CheckpointManager(pathlib.Path(directory).resolve(), options=options)
    self.digests = digests

  @property
  def directory(self) -> pathlib.Path:
    return pathlib.Path(self.manager.directory)

  def step_path(self, step: int) -> pathlib.Path:
    return self.directory / str(step)

  def run_identity(self) -> dict | None:
    """The identity of the run whose checkpoints these are: its workdir's ``run.json``
    (:mod:`fp8jax.train.run_identity`), the folder above; None if it has none."""
    return run_identity.read(self.directory.parent)

  def save(self, step: int, state, data_position: dict, meta: dict, force: bool = False):
    """Saves (if the step is due or ``force``): returns whether a save started. The
    digests are computed on the device before the (asynchronous) write starts."""
    if not (force or self.manager.should_save(step)):
      return False
    meta = {**meta, "code_version": code_version()}
    if (identity := self.run_identity()) is not None:
      meta[RUN] = identity
    items, digested = {"state": _stored(state)}, state
    if self.full_state == "last":  # two items; the digests of the arrays as stored
      items["state"], items[full_state_lib.ITEM] = full_state_lib.split(items["state"],
                                                                self.params_dtype)
      opt = items[full_state_lib.ITEM]
      meta[full_state_lib.META] = {"item": full_state_lib.ITEM,
                                   "master_params": full_state_lib.MASTER in opt}
      digested = {**items["state"], **items[full_state_lib.ITEM]}
    if self.digests:
      meta["digests"] = {**checkpoint_digest.record(digested),
                         "positions": data_positions.record(data_position)}
    if _has_delayed(state):
      meta["delayed_state"] = delayed_sites.layout(getattr(state, DELAYED))
    if layer_stack.is_stacked(state):
      meta[LAYER_RUNS] = layer_stack.layout(state)
    self._drop_old_optimizer_states()  # the previous save is finished and checked first
    with disk_errors(self.step_path(step)):
      started = self.manager.save(step, args=ocp.args.Composite(
          data=ocp.args.JsonSave(data_position), meta=ocp.args.JsonSave(meta),
          **{k: ocp.args.StandardSave(v) for k, v in items.items()},
          **{data_positions.ITEM: data_positions.PositionsSave(data_position)}), force=force)
    if faults.reached(f"checkpoint_save/{step}"):
      faults.kill()
    return started

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def has_optimizer_state(self, step: int) -> bool:
    """Whether checkpoint ``step`` keeps its optimizer state (resume and branch need it)."""
    return full_state_lib.has_optimizer(self.step_path(step), saved_meta(self, step))

  def check_full_state(self, steps, what: str) -> None:
    """Raises :class:`ParamsOnlyCheckpointError` (one line) if one of ``steps`` holds
    the params only; ``what``: the reader, e.g. ``"--resume"``."""
    params_only = [s for s in steps if not self.has_optimizer_state(s)]
    if params_only:
      full = [s for s in self.all_steps() if self.has_optimizer_state(s)]
      raise full_state_lib.refusal(self.directory, params_only, full, what)

  def _drop_old_optimizer_states(self) -> None:
    """Under ``full_state="last"``: waits for the save in flight, then drops the optimizer
    state of every checkpoint older than the newest one that keeps it, once that one is
    flushed to disk and checked (:func:`fp8jax.train.full_state.problem`); not at
    ``keep_full`` steps."""
    if self.full_state != "last":
      return
    with disk_errors(self.directory):
      self.manager.wait_until_finished()
    if multihost.is_main():
      steps = self.all_steps()
      full_state_lib.drop_superseded({s: self.step_path(s) for s in steps},
                                     {s: saved_meta(self, s) for s in steps}, self.keep_full)

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def restore(self, step: int, abstract_state, what: str = "restoring the train state"):
    """(state, data position, meta) of ``step``, verified; ``abstract_state`` gives
    shapes, dtypes and (optionally) shardings. Raises :class:`ParamsOnlyCheckpointError`
    naming ``what`` if the checkpoint holds the params only."""
    self.check_full_state([step], what)
    out, status = self._restore(step, abstract_state, partial=False)
    checkpoint_digest.check(status)
    return out

  def restore_params(self, step: int, abstract_params):
    """(params, meta) of ``step`` without the optimizer state (a partial restore),
    verified; ``abstract_params`` gives shapes, dtypes and shardings."""
    out, status = self._restore(step, {"params": abstract_params}, partial=True)
    checkpoint_digest.check(status)
    return out[0]["params"], out[2]

  def verify(self, step: int, abstract_state) -> checkpoint_digest.Status:
    """What a restore of ``step`` finds (:data:`~fp8jax.train.checkpoint_digest.Status`), without
    raising or warning (from any number of processes: the data positions are a resume's);
    arrays that restore as saved but hold NaN or infinite values are
    :class:`~fp8jax.train.checkpoint_digest.NonFinite`."""
    restored, status = self._restore(step, abstract_state, partial=False, own_position=False)
    if restored is None:
      return status
    status = checkpoint_digest.finite(status, restored[0])
    if isinstance(status, checkpoint_digest.Ok) and not self.has_optimizer_state(step):
      status = checkpoint_digest.Ok(status.checkpoint, status.arrays, params_only=True)
    return status

  def _restore(self, step, abstract, partial: bool, own_position: bool = True):
    """((tree, data position or None, meta), status): the arrays are restored in their
    saved dtype, verified, then cast to ``abstract``'s dtypes; the data position is this
    process's (``own_position``) or process 0's."""
    quiet_closed_loop_callbacks()
    error = None
    try:
      meta = self.manager.restore(step, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore())).meta
      expected, recorded_run = self.run_identity(), meta.get(RUN)
      if expected and recorded_run and recorded_run.get("id") != expected["id"]:
        return None, checkpoint_digest.Foreign(str(self.step_path(step)),
                                               run_identity.describe(recorded_run),
                                               run_identity.describe(expected))
      _check_delayed(self.step_path(step), meta, abstract)
      recorded = meta.get("digests")
      want = layer_stack.layout(abstract)  # None: no params in the tree
      saved_runs = meta.get(LAYER_RUNS) or (want and [[i] for g in want for i in g])
      target = _stored(abstract)
      if saved_runs != want:  # restored as saved, then restacked below
        target = layer_stack.stack(target, saved_runs)
      split = full_state_lib.META in meta and not partial
      if split:  # two items; the optimizer one may be gone (only verify gets here then)
        target = full_state_lib.restore_target(target, meta)
      target = _saved_dtypes(target, (recorded or {}).get("dtypes", {}))
      if split:
        args = full_state_lib.restore_args(target, meta, self.step_path(step))
      elif partial:
        restore_args = jax.tree.map(
            lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding, dtype=a.dtype), target)
        args = ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item=target, restore_args=restore_args, partial_restore=True))
      else:
        args = ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                  data=ocp.args.JsonRestore())
      out = self.manager.restore(step, args=args)
      tree = {**out.state, **(out.get(full_state_lib.ITEM) or {})} if split else out.state
      position = None if partial else out.data
      if own_position and not partial:
        position = data_positions.restore(self.manager, step, out.data)
    except (data_positions.ProcessCountError, DelayedStateMismatchError):
      raise  # a run resumed with another process count or policy: bad input, not damage
    except Exception as e:  # pylint: disable=broad-except
      error = checkpoint_digest.short_error(e)
    if multihost.any_process(error is not None):  # then every process skips the collectives
      return None, checkpoint_digest.Incomplete(str(self.step_path(step)),
                                        error or "does not restore on another process")
    status = checkpoint_digest.verify_tree(str(self.step_path(step)), tree, recorded)
    bad = None if partial else data_positions.check(
        self.step_path(step), (recorded or {}).get("positions"), out.data)
    if multihost.any_process(bad is not None) and not isinstance(status, checkpoint_digest.Corrupt):
      path, found, expected = bad or ("(on another process)", "?", "?")
      status = checkpoint_digest.Corrupt(str(self.step_path(step)), path, expected, found,
                                 what="data position")
    state = full_state_lib.join(tree, _stored(abstract)) if split else tree
    if split and isinstance(state, dict) and full_state_lib.OPT not in state:
      return (state, position, meta), status  # params only: verified, as saved
    if saved_runs != want:  # stored the other way: restacked on the devices
      state = _restacked(state, want, _stored(abstract))
    state = jax.tree.map(lambda x, a: x if x.dtype == a.dtype else x.astype(a.dtype),
                         state, _stored(abstract))
    if _stored(abstract) is not abstract:  # put the empty optional fields back
      state = type(abstract)(**state, **{k: getattr(abstract, k) for k in OPTIONAL
                                         if k not in state})
    return (state, position, meta), status

  def wait(self):
    with disk_errors(self.directory):  # an asynchronous save's error surfaces here
      self.manager.wait_until_finished()
    self._drop_old_optimizer_states()

  def close(self):
    self.manager.close()


def _has_delayed(tree) -> bool:
  return DELAYED in getattr(tree, "_fields", ())


def _stored(tree):
  """What is saved of ``tree``: a train state without its empty :data:`OPTIONAL` fields
  (as a dict of the others) if it has any, anything else as it is."""
  fields = getattr(tree, "_fields", ())
  empty = [k for k in OPTIONAL if k in fields and not jax.tree.leaves(getattr(tree, k))]
  if empty:
    return {k: v for k, v in tree._asdict().items() if k not in empty}
  return tree


def _restacked(state, groups, abstract):
  """``state`` with its layers stored as ``groups``, laid out as ``abstract`` says."""
  shardings = jax.tree.map(lambda a: getattr(a, "sharding", None), abstract)
  if any(s is None for s in jax.tree.leaves(shardings, is_leaf=lambda x: x is None)):
    return layer_stack.stack(state, groups)
  return jax.jit(lambda t: layer_stack.stack(t, groups), out_shardings=shardings)(state)


def _check_delayed(path, meta: dict, abstract) -> None:
  """Raises :class:`DelayedStateMismatchError` when the checkpoint's delayed-scaling state
  (none for checkpoints of earlier versions) is not the one ``abstract`` expects."""
  if not _has_delayed(abstract):
    return
  saved = meta.get("delayed_state", {})
  want = delayed_sites.layout(getattr(abstract, DELAYED))
  if saved != want:
    raise DelayedStateMismatchError(
        f"checkpoint {path} holds the delayed-scaling state {saved or 'none'} (site/layer/"
        f"direction: history shape), but the policy needs {want or 'none'}: restore it "
        "with the policy it was trained with")


def _saved_dtypes(abstract, dtypes: dict):
  """``abstract`` with each leaf's dtype replaced by the dtype it was saved in."""
  def one(path, a):
    saved = dtypes.get(checkpoint_digest.leaf_path(path))
    if saved is None or saved == str(a.dtype):
      return a
    return jax.ShapeDtypeStruct(a.shape, jnp.dtype(saved), sharding=getattr(a, "sharding", None))
  return jax.tree_util.tree_map_with_path(one, abstract)


def saved_meta(where, step: int | None = None) -> dict:
  """The meta of checkpoint ``step`` (default the latest) of a :class:`Checkpointer` or a
  checkpoints folder (only read)."""
  if isinstance(where, Checkpointer):
    manager, own = where.manager, False
  else:
    options = ocp.CheckpointManagerOptions(create=False)  # read_only=True logs a warning
    manager, own = ocp.CheckpointManager(pathlib.Path(where).resolve(), options=options), True
  try:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {manager.directory}")
    return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
  finally:
    if own:
      manager.close()


def saved_policy(where, step: int | None = None) -> dict | None:
  """The precision-policy record (``fp8jax.models.policy.record``) of checkpoint ``step``
  (default the latest) of a :class:`Checkpointer` or a checkpoints folder; None for a
  checkpoint written before records existed."""
  return saved_meta(where, step).get(POLICY)


def policy_difference(saved: dict, current: dict) -> str | None:
  """None when two policy records are equal, else ``'A' (name) vs 'B' (name)`` and the
  fields that differ."""
  if saved == current:
    return None
  keys = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
  name = lambda r: f"{r.get('expression')!r} (name {r.get('name')!r})"  # noqa: E731
  return f"{name(saved)} vs {name(current)}, differing in {keys}"


class NoCheckpointer:
  """What a run without checkpoints (``train.checkpoints=False``) saves: nothing."""

  def __init__(self, directory):
    self.directory = pathlib.Path(directory).resolve()

  def save(self, step, state, data_position, meta, force=False) -> bool:
    del step, state, data_position, meta, force
    return False

  def latest_step(self) -> None:
    return None

  def wait(self):
    pass

  def close(self):
    pass


def abstract_like(tree):
  """ShapeDtypeStructs (with shardings where known) for restoring into ``tree``'s layout."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
