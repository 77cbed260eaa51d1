"""Several jitted functions compiled at once, into JAX's persistent compilation cache.

    parallel_compile.fill_cache({"policy a": lambda: f.lower(*args), ...}, stream, "compare")

A sweep's policies are different programs that a binary would otherwise compile one after
another at their first calls, each XLA compile mostly on one core. Here each function is
lowered in the calling thread (tracing holds Python's lock), then XLA compiles them all on
a thread pool (the compiler releases the lock). The functions' own first calls then reuse
the executables (JAX keeps them in memory, for inputs laid out and committed to devices
as the lowering's were: ``tests/train/test_parallel_compile.py`` counts one XLA compile per
function), and the persistent compilation cache (:mod:`fp8jax.train.compile_cache`) keeps
them for the next run.

Nothing happens when the persistent cache is off (it backs the reuse: without it a
first call that missed the in-memory executable would compile again), for a single
function, on a machine of fewer than 4 cores, or with ``FP8JAX_COMPILE_THREADS=0`` (the
variable sets the threads; default one per two cores). GPU autotuning runs for several
compiles at once on the same device. Importing this module changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
import concurrent.futures
import os
import sys
import time

import jax

MIN_CORES = 4
ENV = "FP8JAX_COMPILE_THREADS"
"""The environment variable that sets the threads (0: compile each function at its first
call, as without this module)."""


def cache_on() -> bool:
  """Whether JAX's persistent compilation cache is on and has a folder."""
  return bool(jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir)


def default_workers(n: int, cores: int | None = None, environ=None) -> int:
  """Threads for ``n`` compiles: ``$FP8JAX_COMPILE_THREADS`` if set, else one per two
  cores (XLA's own codegen runs threads too), 0 (compile at first call) below
  :data:`MIN_CORES` cores; at most ``n``."""
  environ = os.environ if environ is None else environ
  if environ.get(ENV, "").strip():
    try:
      return min(n, max(0, int(environ[ENV])))
    except ValueError:
      raise ValueError(f"{ENV} must be a whole number of threads, got {environ[ENV]!r}") from None
  if cores is None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  cores = cores or 1
  return 0 if cores < MIN_CORES else max(1, min(n, cores // 2))


def fill_cache(lowerings: dict[str, Callable[[], jax.stages.Lowered]], stream=None,
               prefix: str = "compile", workers: int | None = None) -> float | None:
  """Lowers each ``lowerings[name]()`` here and compiles them on ``workers`` threads
  (default :func:`default_workers`); returns the wall seconds, or None when it did
  nothing (see the module docstring). Prints ``[prefix] compiling N functions together``
  and ``[prefix] compiled N functions in S s`` on ``stream`` (default stderr)."""
  n = len(lowerings)
  workers = default_workers(n) if workers is None else workers
  if n < 2 or workers < 2 or not cache_on():
    return None
  stream = stream or sys.stderr
  print(f"[{prefix}] compiling {n} functions together ({workers} threads): "
        f"{', '.join(lowerings)}...", file=stream, flush=True)
  t0 = time.perf_counter()
  try:
    lowered = [lower() for lower in lowerings.values()]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      list(pool.map(lambda low: low.compile(), lowered))
  except Exception as e:  # pylint: disable=broad-except
    # Only a head start: a real error comes back at the function's first call.
    print(f"[{prefix}] warning: compiling together failed ({type(e).__name__}: "
          f"{str(e)[:300]}); each function compiles at its first call", file=stream,
          flush=True)
    return None
  dt = time.perf_counter() - t0
  print(f"[{prefix}] compiled {n} functions in {dt:.1f} s (their first calls reuse them)",
        file=stream, flush=True)
  return dt
