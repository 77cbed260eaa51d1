"""Fault injection for the kill tests: SIGKILL this process at a named point of a write.

With ``FP8JAX_FAULT=<point>@<n>`` set, the ``n``-th time (from 1) this process reaches
``point`` it kills itself with SIGKILL, as the OOM killer or a lost node would: no
handler, no cleanup. Unset (always, outside tests), :func:`reached` is one dictionary
lookup. Points:

* ``checkpoint_save/<step>``: a training checkpoint's save has started (the arrays are
  being written asynchronously) and is not finalised (:mod:`fp8jax.train.checkpoint`);
* ``append/<file name>``: half of a results row has been written and flushed
  (:mod:`fp8jax.study.common.results_io`), as a kill between two writes of the line leaves it.
"""

from __future__ import annotations

import os
import signal

ENV = "FP8JAX_FAULT"
_seen: dict[str, int] = {}


def reached(point: str) -> bool:
  """Whether the process should die at ``point`` now (counts the visits of that point)."""
  spec = os.environ.get(ENV)
  if not spec:
    return False
  name, _, n = spec.rpartition("@")
  if name != point:
    return False
  _seen[point] = _seen.get(point, 0) + 1
  return _seen[point] == int(n)


def kill() -> None:
  """SIGKILL this process."""
  os.kill(os.getpid(), signal.SIGKILL)
