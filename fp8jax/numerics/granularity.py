"""Scaling granularity: which elements share one scale.

A granularity turns a tensor shape into a *block shape*: one scale is computed for
every block. The constructors cover the usual cases:

=====================  ===============================================  ====================
constructor            one scale per                                   DeepSeek-V3 use
=====================  ===============================================  ====================
``per_tensor()``       the whole tensor
``per_axis(axis)``     every slice along ``axis`` (amax reduced over     rowwise / channelwise
                       ``axis``, like ``jnp.max(axis=axis)``)
``tile(n, axis)``      every run of ``n`` contiguous elements along      activations, grads:
                       ``axis`` (1 x n tiles)                           ``tile(128, -1)``
``block((n, m), ...)`` every n x m block over two axes                  weights: 128 x 128
=====================  ===============================================  ====================

Axes are counted like NumPy axes; negative axes count from the end, so the same
granularity applies to tensors with any number of leading batch dimensions. Sizes
that do not divide a dimension leave a smaller last tile: the padding used internally
never enters an amax or a value.
"""

from __future__ import annotations

import dataclasses
import math
import operator

_KINDS = ("tensor", "axis", "tile", "block")


@dataclasses.dataclass(frozen=True)
class Granularity:
  """A hashable description of the scale-sharing blocks.

  Attributes:
    kind: "tensor", "axis", "tile" or "block".
    axes: the axes the block spans (empty for "tensor").
    sizes: block size along each of ``axes``; None means the whole axis.
  """

  kind: str = "tile"
  axes: tuple[int, ...] = (-1,)
  sizes: tuple[int | None, ...] = (128,)

  def __post_init__(self):
    if self.kind not in _KINDS:
      raise ValueError(f"unknown granularity kind {self.kind!r}; known: {_KINDS}")
    object.__setattr__(self, "axes", tuple(_as_int("axis", a) for a in self.axes))
    object.__setattr__(
        self, "sizes", tuple(None if s is None else _as_int("size", s) for s in self.sizes))
    if len(self.axes) != len(self.sizes):
      raise ValueError(f"granularity axes {self.axes} and sizes {self.sizes} differ in length")
    if len(set(self.axes)) != len(self.axes):
      raise ValueError(f"granularity axes {self.axes} repeat an axis")
    expected = {"tensor": 0, "axis": 1, "tile": 1, "block": 2}[self.kind]
    if len(self.axes) != expected:
      raise ValueError(f"{self.kind} granularity needs {expected} axes, got {self.axes}")
    for s in self.sizes:
      if s is not None and s < 1:
        raise ValueError(f"granularity sizes must be >= 1, got {self.sizes}")
    if self.kind in ("tile", "block") and None in self.sizes:
      raise ValueError(f"{self.kind} granularity needs explicit sizes, got {self.sizes}")
    if self.kind == "axis" and self.sizes != (None,):
      raise ValueError(f"axis granularity spans the whole axis (sizes (None,)), got "
                       f"{self.sizes}; use tile() for 1xN tiles")

  def block_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Block shape for a tensor of ``shape``: one scale per block.

    Raises:
      ValueError: when an axis of the granularity does not exist in ``shape``.
    """
    rank = len(shape)
    if self.kind == "tensor":
      return tuple(max(d, 1) for d in shape)
    block = [1] * rank
    for axis in self.axes:
      if not -rank <= axis < rank:
        raise ValueError(
            f"granularity {self.describe()} needs axis {axis}, but the tensor has "
            f"shape {tuple(shape)} (rank {rank})")
    if len({a % rank for a in self.axes}) != len(self.axes):
      raise ValueError(
          f"granularity {self.describe()} names one axis twice for shape {tuple(shape)}")
    for axis, size in zip(self.axes, self.sizes):
      full = shape[axis]
      block[axis] = full if size is None else min(size, full)
    return tuple(max(b, 1) for b in block)

  def num_blocks(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Number of blocks (scales) along each axis of ``shape``."""
    return tuple(
        math.ceil(d / b) if d else 0 for d, b in zip(shape, self.block_shape(shape)))

  def describe(self) -> str:
    """Short human-readable name, e.g. ``1x128@-1`` or ``128x128@(-2,-1)``."""
    if self.kind == "tensor":
      return "per-tensor"
    if self.kind == "axis":
      return f"per-axis@{self.axes[0]}"
    if self.kind == "tile":
      return f"1x{self.sizes[0]}@{self.axes[0]}"
    return f"{self.sizes[0]}x{self.sizes[1]}@{self.axes}"


def _as_int(name: str, value) -> int:
  """``value`` as an int; floats and other types are an error, not truncated."""
  try:
    return operator.index(value)
  except TypeError:
    raise TypeError(f"granularity {name} must be an integer, got {value!r}") from None


def per_tensor() -> Granularity:
  """One scale for the whole tensor."""
  return Granularity("tensor", (), ())


def per_axis(axis: int = -1) -> Granularity:
  """One scale per slice: the amax is reduced over ``axis`` only."""
  return Granularity("axis", (axis,), (None,))


def tile(size: int = 128, axis: int = -1) -> Granularity:
  """1 x ``size`` tiles along ``axis``."""
  return Granularity("tile", (axis,), (size,))


def block(sizes: tuple[int, int] = (128, 128),
          axes: tuple[int, int] = (-2, -1)) -> Granularity:
  """``sizes[0]`` x ``sizes[1]`` blocks over ``axes``."""
  for name, value in (("sizes", sizes), ("axes", axes)):
    if not isinstance(value, (tuple, list)):
      raise TypeError(f"block: {name} must be a pair of integers such as (128, 128), got "
                      f"{type(value).__name__} {value!r}")
  return Granularity("block", tuple(axes), tuple(sizes))
