"""The site grid's cells: their names and expressions, one table for the sweep's grids and
for :func:`fp8jax.models.policy.parse_policy`.

A cell quantizes one module's output (attention or MoE) on a run of consecutive layers in
one format, per tensor, with current or delayed scaling; its name and its expression are
two spellings of one table entry (:data:`COLUMNS`, keyed by the name's prefix and suffix,
with the layer run between them)::

    cell_name("moe", "0-8", "e4m3")                 # "moe_l0-8_e4m3"
    cell_expression("moe", "0-8", "e4m3")           # "moe@0-8:e4m3"
    expression_of("attn_l0_e5m2_delayed")           # "attn@0:e5m2/delayed(h=1024,...)"
    site_grid(9)                                    # the 8 cells of depths l0 and l0-8

A name is read by looking its prefix and suffix up in the table, never by a pattern over
names; :func:`expression_of` gives None for a name that is no cell's.
"""

from __future__ import annotations

DELAYED_SYNTAX = "delayed(h=1024,reduce=max,margin=0)"
"""The delayed-scaling suffix of a spec with its defaults (each argument optional)."""

MODULES = {"attn": "attn_out", "moe": "moe_out"}
"""The grid's modules (a name's first word, the expression's site alias) and their sites."""
FORMATS = ("e4m3", "e5m2")
SCALINGS = {"": "", "_delayed": "/" + DELAYED_SYNTAX}
"""A name's scaling suffix -> the spec's suffix (current scaling, Transformer Engine's
delayed scaling)."""

COLUMNS = {(f"{module}_l", f"_{fmt}{scaling}"): (module, fmt, scaling)
           for module in MODULES for fmt in FORMATS for scaling in SCALINGS}
"""``{(name prefix, name suffix): (module, format, scaling suffix)}``: every column of the
grid; a cell's name is ``prefix + LAYERS + suffix``."""

NAME_FORMS = "{attn,moe}_l<LAYERS>_{e4m3,e5m2}[_delayed] (e.g. moe_l0-8_e4m3)"
"""The cell names, for messages."""


def cell_name(module: str, layers: str, fmt: str, scaling: str = "") -> str:
  """``moe``, ``0-8``, ``e4m3`` -> ``moe_l0-8_e4m3`` (``scaling``: a key of :data:`SCALINGS`)."""
  return f"{module}_l{layers}_{fmt}{scaling}"


def cell_expression(module: str, layers: str, fmt: str, scaling: str = "") -> str:
  """``moe``, ``0-8``, ``e4m3`` -> ``moe@0-8:e4m3``, the cell's policy expression."""
  return f"{module}@{layers}:{fmt}{SCALINGS[scaling]}"


def _is_run(text: str) -> bool:
  """Whether ``text`` is a layer run ``LO`` or ``LO-HI`` (ASCII digits)."""
  lo, dash, hi = text.partition("-")
  return all(s.isascii() and s.isdigit() for s in ([lo, hi] if dash else [lo]))


def expression_of(name: str) -> str | None:
  """The expression of the cell called ``name`` (its column looked up by the name's prefix
  and suffix, the layer run between them), or None when ``name`` is no cell's."""
  for (prefix, suffix), (module, fmt, scaling) in COLUMNS.items():
    run = name[len(prefix):len(name) - len(suffix)]
    if name.startswith(prefix) and name.endswith(suffix) and _is_run(run):
      return cell_expression(module, run, fmt, scaling)
  return None


def site_grid(num_layers: int = 9) -> dict[str, str]:
  """The site grid (the published study's): {attention, MoE} output x {layer 0, layers
  0..L-1} x {E4M3, E5M2}, activations only (per-tensor current scaling, straight-through
  backward), as ``{name: expression}``. For the 2B model (9 layers) the depths are "0" and
  "0-8"."""
  return {cell_name(module, layers, fmt): cell_expression(module, layers, fmt)
          for module in MODULES for layers in ("0", f"0-{num_layers - 1}") for fmt in FORMATS}


def delayed_grid(num_layers: int = 9) -> dict[str, str]:
  """Delayed vs current scaling on the site grid's sites and depths: {attention, MoE}
  output x {layer 0, layers 0..L-1} in E4M3, with per-tensor current scaling (the site
  grid's ``attn_l0_e4m3``, ...) and with Transformer Engine's per-tensor delayed scaling
  (``attn_l0_e4m3_delayed``, ...: history 1024, max, margin 0), straight-through backward.
  The sweep fills the histories by warm-up passes over each evaluation window."""
  return {cell_name(module, layers, "e4m3", scaling):
          cell_expression(module, layers, "e4m3", scaling)
          for module in MODULES for layers in ("0", f"0-{num_layers - 1}") for scaling in SCALINGS}
