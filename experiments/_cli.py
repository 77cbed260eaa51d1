"""The binaries' entry: absl's ``app.run`` with one-line errors.

    if __name__ == "__main__":
      _cli.run(main)

Bad input, unwritable outputs and full disks end the binary with one line on stderr,
``error: ...`` naming the path, and exit status 2: a folder another run holds
(:class:`fp8jax.data.folder_lock.FolderLockedError`), a missing file, a permission
denied, a path that is a file where a folder belongs or the reverse, a full or read-only
file system (``OSError`` with ``ENOSPC``, ``EDQUOT`` or ``EROFS``), a config file that does
not load, a ``--config.<field>`` override that does not apply and a flag value of the wrong
type (``--config.train.steps=abc``: absl alone would exit 1 with two lines). Other
exceptions are
bugs and keep their traceback; with ``--verbosity=1`` (or higher) every error does.

Every binary keeps JAX's persistent compilation cache (:mod:`fp8jax.train.compile_cache`):
``--compile_cache=PATH`` moves it, ``--compile_cache=off`` turns it off; by default it is
``$FP8JAX_COMPILE_CACHE``, else JAX's own ``$JAX_COMPILATION_CACHE_DIR``, else
``~/.cache/fp8jax/jax_cache``.
"""

from __future__ import annotations

import errno
import sys
from typing import NoReturn

from absl import app, flags

EXIT_BAD_INPUT = 2

_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache", None,
    "JAX's persistent compilation cache: a folder, or 'off'. Default: $FP8JAX_COMPILE_CACHE, "
    "else $JAX_COMPILATION_CACHE_DIR, else ~/.cache/fp8jax/jax_cache (docs/study.md: Compilation "
    "cache).")

_DISK = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.ENAMETOOLONG}
_PATHS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
          FileExistsError)


def _one_line(text) -> str:
  """``text`` on one line; a KeyError's quoting (ml_collections nests it in others) undone."""
  text = str(text).replace("\\n", " ").replace("\\'", "'")
  if len(text) > 1 and text[0] in "'\"" and text[-1] == text[0]:
    text = text[1:-1]
  return " ".join(text.split())


def _os_line(e: OSError) -> str:
  if e.filename is None:
    return _one_line(e)
  what = e.strerror or _one_line(e)
  if isinstance(e, FileExistsError):
    what = "exists and is not a folder"
  elif e.errno == errno.ENOSPC:
    what = "no space left on device"
  elif e.errno == errno.EROFS:
    what = "read-only file system"
  elif e.errno == errno.ENAMETOOLONG:
    what = "file name too long (a name over 255 bytes, or a path over the system's limit)"
  return f"{e.filename}: {what}"


def message(e: BaseException) -> str | None:
  """The one line of a known error (see the module doc), None for other exceptions."""
  from fp8jax.data import folder_lock  # pylint: disable=import-outside-toplevel

  if isinstance(e, folder_lock.FolderLockedError):
    return _one_line(e)
  if isinstance(e, OSError) and "Failed loading config file" in str(e):
    reasons = [ln.strip() for ln in str(e).splitlines() if "[Errno" in ln or "Error" in ln]
    return f"--config: the config file does not load: {reasons[-1] if reasons else _one_line(e)}"
  if isinstance(e, _PATHS) or (isinstance(e, OSError) and e.errno in _DISK):
    return _os_line(e)
  return None


def _verbose() -> bool:
  try:
    return int(flags.FLAGS["verbosity"].value) >= 1
  except Exception:  # pylint: disable=broad-except  # flags not parsed yet
    return any(a.startswith(("--verbosity", "-v")) and not a.endswith(("=0", "=-1"))
               for a in sys.argv[1:])


def fail(text: str) -> NoReturn:
  """Prints ``error: text`` on stderr and exits with status 2."""
  print(f"error: {text}", file=sys.stderr, flush=True)
  sys.exit(EXIT_BAD_INPUT)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parse with a flag error (an unknown flag, a value of the wrong type) as one
  line and exit status 2."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(f"bad command line: {_one_line(e)}")


def run(main) -> None:
  """``app.run(main)`` with the persistent compilation cache set up (``--compile_cache``),
  and with the known errors of flag parsing and of ``main`` as one line
  (exit 2); any error while the flags are parsed is a bad command line."""
  started = []

  def wrapped(argv):
    started.append(True)
    from fp8jax.train import compile_cache  # pylint: disable=import-outside-toplevel

    compile_cache.enable(_COMPILE_CACHE.value)  # before the first computation
    return main(argv)

  try:
    app.run(wrapped, flags_parser=_parse_flags)
  except (SystemExit, KeyboardInterrupt):
    raise
  except Exception as e:  # pylint: disable=broad-except
    line = message(e)
    if line is None and not started:  # e.g. a --config.<field> override that does not apply
      dotted = [a for a in sys.argv[1:] if "." in a.split("=", 1)[0]]
      line = f"bad command line {' '.join(dotted)}: {_one_line(e)}".replace("line :", "line:")
    if line is None or _verbose():
      raise
    fail(line)


def define_config_file(name: str, default: str, help_string: str):
  """``config_flags.DEFINE_config_file``, which applies the ``--<name>.<field>=`` overrides
  of the command line to the default file as it is defined: one that does not apply (a
  mistyped field) ends the binary with one line naming it instead of a traceback."""
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel

  try:
    return config_flags.DEFINE_config_file(name, default, help_string)
  except (KeyError, AttributeError, ValueError, TypeError) as e:
    overrides = [a for a in sys.argv[1:] if a.startswith(f"--{name}.")]
    fail(f"--{name} override {' '.join(overrides)} does not apply: "
         f"{_one_line(e)}")


def define_distributed():
  """The ``--distributed`` flag of a binary that can run over several processes; pass it
  to :func:`start_processes`."""
  return flags.DEFINE_bool(
      "distributed", False, "Join a multi-process run: jax.distributed.initialize() from the "
      "cluster (SLURM, Cloud TPU) or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and "
      "JAX_PROCESS_ID (docs/multihost.md).")


def start_processes(distributed) -> None:
  """``fp8jax.train.multihost.start`` with the ``--distributed`` flag's value (joining the
  run when set) and whether ``--verbosity`` was given."""
  from fp8jax.train import multihost  # pylint: disable=import-outside-toplevel

  multihost.start(distributed.value, flags.FLAGS["verbosity"].present)
