"""A read-only table of named rows with array columns, usable as a pytree under jit.

A grouped result has many small groups (one per parameter, module, layer, ...). Returning
each group's scalars as separate outputs of a jitted function makes compilation slow; a
:class:`Table` returns one array per metric (the pytree leaves, [N, ...]) and keeps the N
row names as static data, so they survive ``jax.jit`` and ``jax.device_get``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax


@jax.tree_util.register_pytree_with_keys_class
class Table(Mapping):
  """Rows ``table[name] -> {column: value}`` over columns of shape [N, ...].

  Attributes:
    names: the N row names (static).
    columns: ``{column: array [N, ...]}``.
  """

  __slots__ = ("names", "columns", "_index")

  def __init__(self, names: Sequence[str], columns: Mapping[str, Any]):
    self.names = tuple(names)
    self.columns = dict(columns)
    self._index = None

  def _position(self, name: str) -> int:
    if self._index is None:
      self._index = {n: i for i, n in enumerate(self.names)}
    return self._index[name]

  def __getitem__(self, name: str) -> dict[str, Any]:
    i = self._position(name)
    return {k: v[i] for k, v in self.columns.items()}

  def __contains__(self, name: object) -> bool:
    return name in self.names

  def __iter__(self) -> Iterator[str]:
    return iter(self.names)

  def __len__(self) -> int:
    return len(self.names)

  __eq__ = object.__eq__
  __hash__ = object.__hash__

  def column(self, name: str) -> dict[str, Any]:
    """``{row name: value}`` of one column."""
    values = self.columns[name]
    return {n: values[i] for i, n in enumerate(self.names)}

  def __repr__(self) -> str:
    return f"Table({len(self.names)} rows, columns={sorted(self.columns)})"

  def tree_flatten_with_keys(self):
    keys = tuple(sorted(self.columns))
    children = [(jax.tree_util.DictKey(k), self.columns[k]) for k in keys]
    return children, (self.names, keys)

  @classmethod
  def tree_unflatten(cls, aux, children) -> Table:
    names, keys = aux
    return cls(names, dict(zip(keys, children)))
