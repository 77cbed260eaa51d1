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
"""

from __future__ import annotations

import os
import pathlib

import jax

ENV = "FP8JAX_COMPILE_CACHE"
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"
OFF = ("off", "none", "false", "0")


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
    return environ[JAX_ENV]
  jax.config.update("jax_compilation_cache_dir", where)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  if "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES" not in environ:
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return where
