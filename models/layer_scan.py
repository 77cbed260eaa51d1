"""Scan over runs of alike decoder layers: one traced (and compiled) layer per run.

``apply(..., scan_layers=True)`` splits the layer stack into runs of consecutive layers
that are built alike (dense or MoE) and get the same quantization decisions from the
policy's rules (every site's spec, every linear layer's and the routed experts' GEMM
config), and runs each run of two or more layers as one ``jax.lax.scan``: XLA compiles its
layer once instead of once per layer. Params stored per layer are stacked for it (and
their gradients flow back to the per-layer leaves); params stored stacked
(:mod:`fp8jax.models.layer_stack`) are scanned as stored. The delayed-scaling histories
keep their per-layer layout (stacked the same way: their updates, the gradients, too), the
telemetry and the routing outputs.

The results are those of the layer loop bit for bit where XLA rounds every BF16
intermediate (``XLA_FLAGS=--xla_allow_excess_precision=false``); by default XLA may keep
some in float32, depending on what it fuses, so BF16 values can differ in the last bit
(``tests/models/test_layer_scan.py``).
"""

from __future__ import annotations

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp

from fp8jax.models import policy as policy_lib

# ``param_transform``'s ``where`` for a decoder layer's params (deepseek_moe.apply)
LAYER = "layer"


def linear_paths(layer: nnx.Module) -> tuple[str, ...]:
  """The module paths (``self_attn/q_proj``, ...) of ``layer``'s linear layers."""
  return tuple("/".join(str(k) for k in path) for path, node in nnx.iter_graph(layer)
               if isinstance(node, nnx.Linear))


def signature(layer: nnx.Module, index: int, is_moe: bool, decide) -> tuple:
  """What layer ``index`` computes besides its weights: dense or MoE, its linear layers,
  every site's spec and every GEMM's config (``decide``: ``policy_rules.Decisions``)."""
  paths = linear_paths(layer)
  return (is_moe, paths,
          tuple(decide.site(s, index) for s in policy_lib.SITES),
          tuple(decide.gemm(f"layers/{index}/{p}") for p in paths),
          decide.gemm(f"layers/{index}/mlp", "ragged_dot") if is_moe else None)


def policy_runs(layers, decide) -> list[list[int]]:
  """The runs of alike layers among the decoder-layer modules ``layers`` under the
  decisions ``decide`` (``policy_rules.Decisions``)."""
  return runs([signature(layer, layer.index, layer.is_moe, decide) for layer in layers])


def runs(signatures: list) -> list[list[int]]:
  """Indices grouped into runs of consecutive equal signatures: [[0, 1], [2], [3, 4, 5]]."""
  out: list[list[int]] = []
  for i, sig in enumerate(signatures):
    if out and signatures[out[-1][0]] == sig:
      out[-1].append(i)
    else:
      out.append([i])
  return out


@dataclasses.dataclass(frozen=True)
class ScanOptions:
  """How a run is scanned (``scan_layers=ScanOptions(...)``; ``True`` is the default).

  ``unroll``: layers per iteration of the scan's loop (``jax.lax.scan``'s ``unroll``); 0,
  the default: the whole run, so that the compiled program has no loop while the layer is
  still traced once. Rolled (1), the scan keeps every residual its backward pass reads
  stacked over the run (docs/performance/archive/2026-11-28_layer_stack_4_gpus.md: memory and
  speed of each). ``remat``: a policy of ``jax.checkpoint_policies`` by name
  (``"dots_saveable"``, ``"nothing_saveable"``, ...) for what a layer keeps for its backward
  pass (the rest is recomputed there), or None: everything the backward pass reads is kept
  (stacked per layer).
  """
  unroll: int = 0
  remat: str | None = None

  def __post_init__(self):
    if self.unroll < 0:
      raise ValueError(f"ScanOptions.unroll is {self.unroll}: layers per iteration, >= 0")
    if self.remat is not None and not callable(getattr(jax.checkpoint_policies,
                                                       self.remat, None)):
      names = sorted(n for n in dir(jax.checkpoint_policies) if n.endswith("saveable"))
      raise ValueError(f"ScanOptions.remat {self.remat!r} is no policy of "
                       f"jax.checkpoint_policies; some are {names}")


def options(scan_layers) -> ScanOptions | None:
  """``scan_layers`` (bool or :class:`ScanOptions`) as options, None: the layer loop."""
  if isinstance(scan_layers, ScanOptions):
    return scan_layers
  return ScanOptions() if scan_layers else None


def _stack(trees: list):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def scan(step, graphdef, stacked, group: list[int], h, delayed_state,
         opts: ScanOptions = ScanOptions(), param_transform=None):
  """Runs ``step(layer, h, index, delayed) -> (h, out)`` over the layers ``group`` (alike
  per :func:`signature`) as one scan, with the decisions of the first; ``graphdef``: the
  first layer's (the others differ only in their index attribute); ``stacked``: their
  param state with a leading axis ``len(group)`` (:func:`stack_states`, or params stored
  stacked: :mod:`fp8jax.models.layer_stack`); ``delayed``: the histories of that layer,
  ``{site: {group[0]: histories}}``; ``opts``: unrolling and rematerialization;
  ``param_transform``: ``fn(params, LAYER)``, applied to each layer's params in its
  iteration (None: none; see ``deepseek_moe.apply``).

  Returns:
    (h after the last layer, ``{index: out}`` per layer of ``group``).
  """
  first = group[0]
  hist = {site: _stack([per_layer[i] for i in group])
          for site, per_layer in (delayed_state or {}).items() if first in per_layer}

  def body(h, xs):
    params, histories = xs
    if param_transform is not None:
      params = param_transform(params, LAYER)
    return step(nnx.merge(graphdef, params), h, first,
                {site: {first: v} for site, v in histories.items()})

  if opts.remat is not None:
    body = jax.checkpoint(body, policy=getattr(jax.checkpoint_policies, opts.remat))
  h, ys = jax.lax.scan(body, h, (stacked, hist), unroll=opts.unroll or True)
  return h, {i: jax.tree.map(lambda y, k=k: y[k], ys) for k, i in enumerate(group)}


def stack_states(layers: list):
  """(graphdef, stacked param state) of the modules ``layers`` for :func:`scan`."""
  graphdef, state = nnx.split(layers[0])
  return graphdef, _stack([state, *(nnx.state(layer) for layer in layers[1:])])
