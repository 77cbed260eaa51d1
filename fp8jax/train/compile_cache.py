"""JAX's persistent compilation cache, as the binaries turn it on.

    path = compile_cache.enable(flag_value)   # before the first computation

A binary that runs again with the same model, shapes and policies reads its compiled
executables from the cache instead of compiling them. Where the cache lives, the first
of these that is set:

1. ``--compile_cache=PATH`` (or ``--compile_cache=off``: no persistent cache);
2. the environment variable ``FP8JAX_COMPILE_CACHE`` (``PATH`` or ``off``);
3. JAX's own ``JAX_COMPILATION_CACHE_DIR`` (left as JAX reads it, with JAX's thresholds);
4. :data:`DEFAULT`: ``$XDG_CACHE_HOME/fp8jax/jax_cache``, else
   ``~/.cache/fp8jax/jax_cache``.

Every compilation is cached (minimum compile time 0 s, minimum entry size 0 bytes) unless
``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` or ``JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES``
says otherwise, so that a rerun compiles nothing. Importing this module changes nothing.

JAX writes an entry in place, and keeps an existing entry. So an entry cut short (a full
disk, a kill) would fail to read, with a warning, at every later run. :func:`enable`
therefore first checks the entries written since its last check (:func:`repair`) and
removes the ones that do not decompress, with one line naming how many.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

import jax

ENV = "FP8JAX_COMPILE_CACHE"
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"
OFF = ("off", "none", "false", "0")
CHECKED = ".fp8jax_checked"
"""The marker file whose mtime is the time of the last :func:`repair` of a folder."""
_ENTRY, _ATIME = "-cache", "-atime"  # JAX's lru_cache suffixes


def default_dir(environ=None) -> pathlib.Path:
  """``$XDG_CACHE_HOME/fp8jax/jax_cache`` (default ``~/.cache/fp8jax/jax_cache``)."""
  environ = os.environ if environ is None else environ
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "fp8jax" / "jax_cache"


DEFAULT = "~/.cache/fp8jax/jax_cache"
"""The default location as the flags' help names it (:func:`default_dir` resolves it)."""


def resolve(flag: str | None, environ=None) -> str | None:
  """The cache folder the setting ``flag`` (None or ``""``: not given) picks, per the module
  doc; None: off. ``jax`` when ``JAX_COMPILATION_CACHE_DIR`` applies (JAX reads it)."""
  environ = os.environ if environ is None else environ
  for value in (flag, environ.get(ENV)):
    if value is None or value.strip() == "":
      continue
    value = value.strip()
    return None if value.lower() in OFF else str(pathlib.Path(value).expanduser())
  if environ.get(JAX_ENV):
    return "jax"
  return str(default_dir(environ))


def enable(flag: str | None = None, environ=None) -> str | None:
  """Turns the persistent cache on (or off) as ``flag`` and the environment say (see
  :func:`resolve`); returns the folder used, or None when off. Call it before the first
  computation: JAX sets its cache up at the first compilation."""
  environ = os.environ if environ is None else environ
  where = resolve(flag, environ)
  if where is None:
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  jax.config.update("jax_enable_compilation_cache", True)
  if where == "jax":
    repair(environ[JAX_ENV])
    return environ[JAX_ENV]
  repair(where)
  jax.config.update("jax_compilation_cache_dir", where)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  if "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES" not in environ:
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return where


def _decompress():
  """JAX's own reader of an entry's bytes (zstd or zlib, as it wrote them); None if this
  JAX version does not have it where expected."""
  try:
    from jax._src import compilation_cache  # pylint: disable=import-outside-toplevel
    return compilation_cache.decompress_executable
  except (ImportError, AttributeError):
    return None


def repair(folder, stream=None) -> list[str]:
  """Removes the cache entries of ``folder`` written since its last check (all of them at
  the first) that are empty or do not decompress, with their access-time files; returns
  their names and prints one line to ``stream`` (default stderr) if there were any. A
  missing folder, or a JAX without the reader, is left alone."""
  folder = pathlib.Path(folder).expanduser()
  decompress = _decompress()
  if decompress is None or not folder.is_dir():
    return []
  marker = folder / CHECKED
  since = marker.stat().st_mtime if marker.exists() else -1.0
  now = time.time()  # entries written during the scan are checked next time
  removed = []
  for entry in folder.glob("*" + _ENTRY):
    try:
      if entry.stat().st_mtime < since:
        continue
      data = entry.read_bytes()
      ok = bool(data)
      if ok:
        decompress(data)
    except FileNotFoundError:  # removed meanwhile by another process
      continue
    except Exception:  # pylint: disable=broad-except  # any failure to read: damaged
      ok = False
    if not ok:
      for path in (entry, entry.with_name(entry.name[:-len(_ENTRY)] + _ATIME)):
        path.unlink(missing_ok=True)
      removed.append(entry.name)
  try:
    marker.touch()
    os.utime(marker, (now, now))
  except OSError:  # a read-only or full cache folder: checked again next time
    pass
  if removed:
    print(f"compile cache: removed {len(removed)} damaged entr"
          f"{'y' if len(removed) == 1 else 'ies'} (a write cut short, e.g. by a full disk) "
          f"from {folder}; they compile again", file=stream or sys.stderr)
  return removed
