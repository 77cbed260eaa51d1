"""Where a comparison sweep reads its params: a checkpoint source.

    source = RunFolder("out/train")             # a training run's verified checkpoints
    source = InMemory({0: params, 100: later})  # params in memory, by step
    sweep.evaluate(model, source, batches, "out/compare", policies)

A source (:class:`Checkpoints`) lists its ``steps`` and gives the params of one step laid
out as ``abstract`` says (``jax.ShapeDtypeStruct`` leaves with shardings). The sweep
(:func:`fp8jax.study.comparison.sweep.evaluate`) takes either alike.
"""

from __future__ import annotations

from collections.abc import Mapping
import pathlib
from typing import Any, Protocol

import jax

from fp8jax.train import checkpoint as ckpt_lib


class Checkpoints(Protocol):
  """A sweep's params by step.

  Attributes:
    steps: the steps it holds, ascending.
    workdir: the training run's folder (``""`` for params in memory), for ``meta.json``.
  """
  steps: tuple[int, ...]
  workdir: str

  def load(self, step: int, abstract) -> Any:
    """The params of ``step`` laid out as ``abstract``; raises
    :class:`fp8jax.train.checkpoint_digest.CheckpointError` for a corrupt checkpoint."""


class RunFolder:
  """The checkpoints of the training run in ``train_workdir`` (``checkpoints/``), each
  verified as it is restored (:mod:`fp8jax.train.checkpoint_digest`); the params only."""

  def __init__(self, train_workdir):
    path = pathlib.Path(train_workdir)
    self.workdir = str(path.resolve())
    self.checkpointer = ckpt_lib.Checkpointer(path / "checkpoints", save_every=1)
    self.steps = tuple(self.checkpointer.all_steps())

  def load(self, step: int, abstract):
    return self.checkpointer.restore_params(step, abstract)[0]

  def close(self) -> None:
    self.checkpointer.close()


class InMemory:
  """Params in memory: ``{step: params}`` (int steps), or one params tree (step 0)."""

  workdir = ""

  def __init__(self, params: Mapping[int, Any] | Any):
    by_step = (dict(params) if isinstance(params, Mapping)
               and all(isinstance(k, int) for k in params) else {0: params})
    self.params = dict(sorted(by_step.items()))
    self.steps = tuple(self.params)

  def load(self, step: int, abstract):
    """The params of ``step`` placed as ``abstract``'s shardings say (where it has them)."""
    return jax.tree.map(
        lambda x, a: jax.device_put(x, a.sharding) if getattr(a, "sharding", None) else x,
        self.params[step], abstract)
