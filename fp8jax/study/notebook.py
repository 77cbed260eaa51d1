"""What the Colab notebooks share: the opening banner and the tables they show.

A notebook starts with :func:`start` (the size from ``FP8JAX_SMOKE``, the JAX and fp8jax
versions, the backend and devices) and shows results with :func:`show_table` and
:func:`show_markdown`: rendered as markdown inside a notebook kernel, printed as text in a
plain script (``python colab/NAME.py``). IPython is imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import os
import sys
import time
from typing import Any, TextIO

import numpy as np

from fp8jax.metrics import flatten
from fp8jax.study.common import stats

SMOKE_VARIABLE = "FP8JAX_SMOKE"


def interactive() -> bool:
  """True inside an IPython kernel (a notebook), False in a plain script."""
  try:
    from IPython import get_ipython  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  return get_ipython() is not None


@dataclasses.dataclass(frozen=True)
class Session:
  """A notebook's run.

  Attributes:
    smoke: ``FP8JAX_SMOKE=1``: the small size that CI executes.
    interactive: running in a notebook kernel (rich display available).
    started: ``time.time()`` at :func:`start`, in seconds.
  """

  smoke: bool
  interactive: bool
  started: float

  def elapsed(self) -> float:
    """Seconds since :func:`start`."""
    return time.time() - self.started


def start(stream: TextIO | None = None) -> Session:
  """Prints the versions, backend, devices and size of this run; returns the :class:`Session`.

  Raises:
    ValueError: ``FP8JAX_SMOKE`` is set to something other than 0 or 1.
  """
  import jax  # pylint: disable=import-outside-toplevel

  import fp8jax  # pylint: disable=import-outside-toplevel

  value = os.environ.get(SMOKE_VARIABLE, "0")
  if value not in ("0", "1"):
    raise ValueError(f"{SMOKE_VARIABLE}={value!r}: expected 0 (full size) or 1 (smoke size)")
  stream = stream or sys.stdout
  smoke = value == "1"
  print(f"jax {jax.__version__}, fp8jax {fp8jax.__version__}, backend "
        f"{jax.default_backend()}", file=stream)
  print("devices:", jax.devices(), file=stream)
  print("smoke size" if smoke else "full size", file=stream)
  return Session(smoke=smoke, interactive=interactive(), started=time.time())


def cell(v: Any) -> str:
  """A table cell: floats to 4 significant digits, None empty, booleans yes / no."""
  if v is None:
    return ""
  if isinstance(v, bool | np.bool_):
    return "yes" if v else "no"
  if isinstance(v, float | np.floating):
    return f"{float(v):.4g}"
  return str(v)


def table_lines(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                title: str | None = None) -> list[str]:
  """A list of dicts as markdown lines; ``columns`` defaults to the first row's keys.

  Raises:
    ValueError: no rows and no columns.
  """
  if not rows and not columns:
    raise ValueError(f"an empty table{f' ({title})' if title else ''} needs its columns")
  columns = list(columns or rows[0])
  head = [f"**{title}**", ""] if title else []
  return head + stats.table(columns, ([cell(r.get(c)) for c in columns] for r in rows))


def show_markdown(lines: Sequence[str], stream: TextIO | None = None) -> None:
  """Markdown lines: rendered in a notebook, printed in a script."""
  text = "\n".join(lines)
  if interactive():
    from IPython.display import Markdown, display  # pylint: disable=import-outside-toplevel
    display(Markdown(text))
  else:
    print(text.rstrip("\n") + "\n", file=stream or sys.stdout)


def show_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
               title: str | None = None, stream: TextIO | None = None) -> None:
  """:func:`table_lines`, shown with :func:`show_markdown`."""
  show_markdown(table_lines(rows, columns, title), stream)


def row(rows: Sequence[Mapping[str, Any]], **match: Any) -> Mapping[str, Any]:
  """The one row of ``rows`` whose fields equal ``match``.

  Raises:
    LookupError: no row or several rows match.
  """
  found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
  if len(found) != 1:
    raise LookupError(f"{len(found)} rows match {match}, expected exactly one")
  return found[0]


def show_tree(tree: Any, autovisualize: bool = False, stream: TextIO | None = None) -> None:
  """A params-like pytree: treescope in a notebook (where installed), else one printed line
  per leaf (path, shape, L2 norm)."""
  if interactive():
    try:
      import treescope  # pylint: disable=import-outside-toplevel
    except ImportError:
      treescope = None
    if treescope is not None:
      treescope.show(tree, autovisualize=autovisualize)
      return
  for path, leaf in flatten(tree).items():
    norm = float(np.linalg.norm(np.ravel(np.asarray(leaf, np.float64))))
    print(f"  {path:48s} {str(tuple(np.shape(leaf))):14s} |x| = {norm:.4g}",
          file=stream or sys.stdout)
