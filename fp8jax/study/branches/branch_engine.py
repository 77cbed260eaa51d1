"""The compiled steps of a branch-off run and one group of branches trained beside the
BF16 reference (:mod:`fp8jax.study.branches.branch` runs them per checkpoint)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from fp8jax.study.branches import branch_memory, branch_metrics
from fp8jax.train import loop, parallel_compile
from fp8jax.train import mesh as mesh_lib

REFERENCE = "bf16"
"""The name of the reference branch."""


@dataclasses.dataclass
class Branch:
  """One branch: its name, kind and the policy its step computes under."""
  name: str
  kind: str            # "reference", "noise" or "policy"
  policy: Any  # what the model's apply takes
  expr: str


class Engine:
  """The compiled steps and the comparison of one run's branches (``all_branches``;
  ``branches``: their :class:`~fp8jax.study.branches.branch.Branches` settings)."""

  def __init__(self, train_cfg, model, mesh, all_branches, branches,
               trained_policy=None):
    self.cfg, self.model, self.mesh, self.branches = train_cfg, model, mesh, branches
    self.tx = loop.optimizer_for(train_cfg)
    _, self.abstract, self.sharding = loop.state_layout(train_cfg, model, self.tx, mesh,
                                                        trained_policy)
    rep = mesh_lib.replicated(mesh)
    self.steps, self.layouts = {}, {}
    for b in all_branches:
      key = b.policy.name if b.kind == "policy" else REFERENCE
      if key in self.steps:
        continue
      delayed = model.delayed_init(b.policy)
      sharding = self.sharding._replace(delayed=jax.tree.map(lambda _: rep, delayed))
      self.layouts[key] = (delayed, sharding)
      self.steps[key] = loop.build_step(train_cfg, model, self.tx, b.policy, mesh,
                                        sharding, with_routing=True)
    params_sharding = self.sharding.params
    self.copy = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=params_sharding)
    self.copy_state = jax.jit(lambda s: jax.tree.map(jnp.copy, s), out_shardings=self.sharding)
    self.compare = mesh_lib.under_mesh(jax.jit(
        functools.partial(branch_metrics.compare_step, classifier=model.classifier),
        out_shardings=rep), mesh)
    self.perturb = jax.jit(branch_metrics.perturb, static_argnums=2,
                           out_shardings=params_sharding)

  def _tokens(self) -> jax.ShapeDtypeStruct:
    data = self.cfg.data
    return jax.ShapeDtypeStruct((data.global_batch, data.seq_len), jnp.int32,
                                sharding=mesh_lib.batch_sharding(self.mesh))

  def _lowerings(self) -> dict:
    """``{policy key: () -> the lowered step}`` on the run's abstract state and batch."""
    tokens, out = self._tokens(), {}
    for key, step in self.steps.items():
      delayed, sharding = self.layouts[key]
      state = loop.restore_target(self.abstract._replace(delayed=delayed), sharding)
      out[key] = functools.partial(step.lower, state, tokens)
    return out

  def fill_cache(self, stream) -> None:
    """Every policy's step compiled together (:mod:`fp8jax.train.parallel_compile`)."""
    parallel_compile.fill_cache({f"the step of policy {key}": lower
                                 for key, lower in self._lowerings().items()}, stream, "branch")

  def step_temp_bytes(self) -> int | None:
    """The largest temporary memory of the compiled steps per device (None: unknown, or
    no memory limit to fit, e.g. CPU: nothing is compiled for it)."""
    if not (self.mesh.devices.flat[0].memory_stats() or {}).get("bytes_limit"):
      return None
    temps = [branch_memory.temp_bytes(lower().compile()) for lower in self._lowerings().values()]
    return None if None in temps or not temps else max(temps)

  def restore(self, ckpt, step: int, groups: int, keep: bool):
    """(:class:`~fp8jax.study.branches.branch_memory.RestoredState` for ``groups`` groups,
    data position) of checkpoint ``step``; its meta's policy was checked before any step
    (``check_trained_policies``)."""
    read = functools.partial(ckpt.restore, step, loop.restore_target(self.abstract,
                                                                     self.sharding), "branch")
    state, position, _ = read()
    return branch_memory.RestoredState(state, self.sharding, groups, lambda: read()[0],
                                       keep), position

  def _batches(self, position) -> list:
    """The ``k`` batches the run reads after the data position ``position``."""
    data = loop.make_data(self.cfg, self.mesh, self.model.vocab_size)
    try:
      data.set_state(position)
      return [mesh_lib.global_batch(next(data), self.mesh) for _ in range(self.branches.k)]
    finally:
      getattr(data, "close", lambda: None)()

  def _start(self, state, b: Branch, noise_index: int):
    key = b.policy.name if b.kind == "policy" else REFERENCE
    delayed, sharding = self.layouts[key]
    start = self.copy_state(state)  # every branch owns its buffers: the steps donate them
    if b.kind == "noise":
      start = start._replace(params=self.perturb(start.params, jax.random.fold_in(
          jax.random.key(self.branches.noise_seed), noise_index), self.branches.noise_scale))
    # The step donates its state: the empty histories are copied for every branch.
    start = start._replace(delayed=jax.tree.map(jnp.copy, delayed))
    return jax.device_put(start, sharding), self.steps[key]

  def run_group(self, source, position, from_step: int, group: list[Branch],
                tick) -> list[dict]:
    """The reference and ``group`` trained ``k`` steps from checkpoint ``from_step`` (its
    :class:`~fp8jax.study.branches.branch_memory.RestoredState` ``source`` and data
    ``position``); their branches.jsonl lines (the reference's first). The state taken
    from ``source`` is freed once every branch has its own copy."""
    state = source.take()
    batches = self._batches(position)
    noise_names = self.branches.noise_names()
    reference = Branch(REFERENCE, "reference", self.model.baseline, "bf16")
    live = [(reference, *self._start(state, reference, 0))]
    for b in group:
      idx = noise_names.index(b.name) if b.kind == "noise" else 0
      live.append((b, *self._start(state, b, idx)))
    del state
    series = {b.name: [] for b, _, _ in live}
    for t, tokens in enumerate(batches):
      ref_b, ref_state, ref_fn = live[0]
      ref_prev = self.copy(ref_state.params)
      ref_state, m_ref = ref_fn(ref_state, tokens)
      live[0] = (ref_b, ref_state, ref_fn)
      out = {REFERENCE: (_scalars(m_ref), None)}
      for i in range(1, len(live)):
        b, st, fn = live[i]
        prev = self.copy(st.params)
        st, m = fn(st, tokens)
        out[b.name] = (_scalars(m), self.compare(ref_state.params, ref_prev, st.params, prev,
                                                 m_ref["routing"], m["routing"]))
        del prev
        live[i] = (b, st, fn)
      del ref_prev
      _record(series, t + 1, out)
      tick(t + 1)
    return [branch_metrics.row(from_step, b.name, b.kind, b.expr, series[b.name])
            for b, _, _ in live]


def _scalars(metrics: dict) -> dict:
  """A step's metrics without its routing choices (read by the comparison only)."""
  return {k: v for k, v in metrics.items() if k != "routing"}


def _record(series: dict, step: int, out: dict) -> None:
  """Appends step ``step``'s host records to ``series``: ``out`` maps each branch (the
  reference first) to its (metrics, comparison) on the devices, read here in one call."""
  host = jax.device_get(out)
  ref = branch_metrics.record(step, host[REFERENCE][0], None, None)
  series[REFERENCE].append(ref)
  for name, (m, cmp) in host.items():
    if name != REFERENCE:
      series[name].append(branch_metrics.record(step, m, ref["loss"], cmp))
