"""Checkpoint integrity: a digest per saved array, and what a restore found.

Every checkpoint fp8jax writes records a digest of each array it saves (training
checkpoints in their ``meta`` item, converted HF checkpoints in ``meta.json``), and every
reader recomputes the digests of the arrays it restored, in their saved dtype and before
any cast, and compares them (:func:`verify_tree`). The outcome is a :data:`Status`:
:class:`Ok`, :class:`Corrupt` (an array's digest differs: the first such array and both
digests), :class:`Incomplete` (the files do not restore at all) or :class:`NoDigests` (a
checkpoint written before digests existed: it loads, with an
:class:`UnverifiedCheckpointWarning`). :func:`check` turns a status into that warning or
into a :class:`CheckpointError` (a ``ValueError``, so the binaries report it as bad input).

The digest (:data:`ALGORITHM`) is computed on the device by one jitted function over the
whole pytree, in wrapping uint32 arithmetic, which is exact and identical on every
platform and for any reduction order. Each element's bits are one 32-bit word ``w_i``
(8- and 16-bit elements zero-extended, 64-bit elements two words, low word first), ``i``
its flat C-order position mod 2**32, ``n`` the number of words:

    A = sum_i w_i * ((2 i + 1) * 0x9E3779B1)            mod 2**32
    B = sum_i fmix32(w_i ^ fmix32(i + 0x7F4A7C15))       mod 2**32
    digest = hex8(fmix32(A ^ n)) + hex8(fmix32(B + n))   (16 hex digits)

``fmix32`` is MurmurHash3's finaliser (a bijection of uint32). Words are per element, not
packed, so no reshape or padding is needed and the digest runs in place on sharded
arrays. What it detects: accidental corruption. A change of one word (any bits of an
element of up to 32 bits) always changes both lanes (odd multipliers, bijections); swapped,
zeroed or garbled blocks change the digest unless coincidences of about 2**-32 cancel them
in both lanes. It is not a cryptographic
hash: it does not detect deliberate tampering.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import warnings

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

ALGORITHM = "fp8jax-u32x2/1"
"""The digest's name and version, recorded next to the digests."""

_MASK = 0xFFFFFFFF
K_A, K_B = 0x9E3779B1, 0x7F4A7C15


def _fmix32(h):
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _words(x) -> jax.Array:
  """The element bits as uint32 words (64-bit elements: a trailing axis of 2)."""
  dt = jnp.dtype(x.dtype)
  if dt == jnp.bool_:
    return x.astype(jnp.uint32)
  if jnp.issubdtype(dt, jnp.complexfloating) or dt.itemsize not in (1, 2, 4, 8):
    raise TypeError(f"no digest for arrays of dtype {dt}")
  if dt.itemsize in (1, 2):
    return lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * dt.itemsize}")).astype(jnp.uint32)
  return lax.bitcast_convert_type(x, jnp.uint32)


def _flat_index(shape) -> jax.Array:
  """The C-order position of every element, mod 2**32 (no reshape: sharding-friendly)."""
  index, stride = jnp.zeros(shape, jnp.uint32), 1
  for d in reversed(range(len(shape))):
    index = index + lax.broadcasted_iota(jnp.uint32, shape, d) * jnp.uint32(stride & _MASK)
    stride *= shape[d]
  return index


@jax.jit  # traced once per shape and dtype, inlined into _leaf_lanes
def _lanes(x) -> jax.Array:
  w = _words(x)
  i = _flat_index(w.shape)
  a = jnp.sum(w * ((i * jnp.uint32(2) + jnp.uint32(1)) * jnp.uint32(K_A)), dtype=jnp.uint32)
  b = jnp.sum(_fmix32(w ^ _fmix32(i + jnp.uint32(K_B))), dtype=jnp.uint32)
  return jnp.stack([a, b])


@jax.jit
def _leaf_lanes(leaves):
  return jnp.stack([_lanes(x) for x in leaves])  # [leaves, 2]: one transfer to the host


def _fmix32_int(h: int) -> int:
  h ^= h >> 16
  h = (h * 0x85EBCA6B) & _MASK
  h ^= h >> 13
  h = (h * 0xC2B2AE35) & _MASK
  return h ^ (h >> 16)


def _n_words(x) -> int:
  dt = jnp.dtype(x.dtype)
  return int(np.prod(x.shape)) * (2 if dt.itemsize == 8 and dt != jnp.bool_ else 1)


def leaf_path(keypath) -> str:
  """``params/layers/0/mlp/experts_up``: a pytree key path as a slash-separated string."""
  parts = []
  for k in keypath:
    attr = next((a for a in ("key", "name", "idx") if hasattr(k, a)), None)
    parts.append(str(getattr(k, attr) if attr else k))
  return "/".join(parts)


def _leaves(tree) -> list[tuple[str, object]]:
  """(path, array) of every leaf; Python scalars as NumPy arrays."""
  return [(leaf_path(p), x if hasattr(x, "dtype") else np.asarray(x))
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _device_input(x):
  """64-bit NumPy leaves as uint32 word pairs when JAX runs without x64 (it would
  otherwise narrow them before the digest sees their bits)."""
  if isinstance(x, np.ndarray) and x.dtype.itemsize == 8 and not jax.config.jax_enable_x64:
    return np.ascontiguousarray(x).view("<u4").reshape(*x.shape, 2)
  return x


def _digests(leaves: list[tuple[str, object]]) -> dict[str, str]:
  lanes = jax.device_get(_leaf_lanes([_device_input(x) for _, x in leaves])) if leaves else []
  out = {}
  for (path, x), (a, b) in zip(leaves, lanes):
    n = _n_words(x) & _MASK
    out[path] = f"{_fmix32_int(int(a) ^ n):08x}{_fmix32_int((int(b) + n) & _MASK):08x}"
  return out


def tree_digests(tree) -> dict[str, str]:
  """``{array path: digest}`` of every array leaf of ``tree`` (one jitted call over the
  leaves, one transfer of the results to the host)."""
  return _digests(_leaves(tree))


def record(tree) -> dict:
  """What a save stores next to its arrays: the algorithm, ``{path: digest}`` and
  ``{path: dtype}`` (a reader restores in the saved dtype, verifies, then casts)."""
  leaves = _leaves(tree)
  return {"algorithm": ALGORITHM, "arrays": _digests(leaves),
          "dtypes": {path: str(x.dtype) for path, x in leaves}}


# --- what a restore found ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Ok:
  """Every restored array matches its recorded digest; ``params_only``: the checkpoint
  holds no optimizer state (:mod:`fp8jax.train.full_state`)."""
  checkpoint: str
  arrays: int
  params_only: bool = False


@dataclasses.dataclass(frozen=True)
class Corrupt:
  """The restored array ``path`` (or, ``what="data position"``, the positions file
  ``path``) does not match: ``found`` != ``expected`` (recorded at save); ``more`` other
  arrays do not match either."""
  checkpoint: str
  path: str
  expected: str
  found: str
  more: int = 0
  what: str = "array"


@dataclasses.dataclass(frozen=True)
class Incomplete:
  """The checkpoint's files do not restore (a torn save, a truncated or garbled file)."""
  checkpoint: str
  error: str


@dataclasses.dataclass(frozen=True)
class NoDigests:
  """The checkpoint carries no digests it can be checked against (``reason``)."""
  checkpoint: str
  reason: str = "written before checkpoints carried digests"


@dataclasses.dataclass(frozen=True)
class NonFinite:
  """The arrays restore as saved, but ``path`` holds ``count`` NaN or infinite values
  (``more`` other arrays too): a state no step should have saved."""
  checkpoint: str
  path: str
  count: int
  more: int = 0


@dataclasses.dataclass(frozen=True)
class Foreign:
  """The checkpoint records another run than its workdir's (copied in from elsewhere):
  ``run`` and ``expected`` are the descriptions of both identities
  (:mod:`fp8jax.train.run_identity`)."""
  checkpoint: str
  run: str
  expected: str


Status = Ok | Corrupt | Incomplete | NoDigests | NonFinite | Foreign


def describe(status: Status) -> str:
  """One line: ``ok (N arrays)``, ``corrupt: array ... ``, ``incomplete: ...``, ..."""
  match status:
    case Ok(arrays=n, params_only=params_only):
      also = "; params only, the optimizer state dropped" if params_only else ""
      return f"ok ({n} arrays verified{also})"
    case Corrupt(path=path, expected=expected, found=found, more=more, what=what):
      also = f" (and {more} more arrays)" if more else ""
      return (f"corrupt: {what} {path} has digest {found}, its save recorded {expected}"
              f"{also}")
    case Incomplete(error=error):
      return f"incomplete: does not restore ({error})"
    case NoDigests(reason=reason):
      return f"not verified: no digests ({reason})"
    case NonFinite(path=path, count=count, more=more):
      also = f" (and {more} more arrays)" if more else ""
      return f"corrupt: array {path} holds {count} NaN or infinite values{also}"
    case Foreign(run=run, expected=expected):
      return (f"from another run: it records {run}, its workdir is {expected} (copied in "
              "from elsewhere?)")
  raise TypeError(f"not a checkpoint status: {status!r}")


class CheckpointError(ValueError):
  """A checkpoint that must not be used; ``status`` says why."""

  def __init__(self, status: Corrupt | Incomplete | NonFinite | Foreign):
    super().__init__(f"checkpoint {status.checkpoint} is {describe(status)}")
    self.status = status


class CorruptCheckpointError(CheckpointError):
  """A restored array differs from the one that was saved."""


class ForeignCheckpointError(CheckpointError):
  """The checkpoint belongs to another run than its workdir's."""


class IncompleteCheckpointError(CheckpointError):
  """A checkpoint whose files do not restore."""


class UnverifiedCheckpointWarning(UserWarning):
  """A checkpoint loaded without verification (it carries no digests)."""


def short_error(e: BaseException, limit: int = 300) -> str:
  """``Type: first line`` of the innermost cause of ``e`` (Orbax wraps TensorStore's
  precise error, e.g. which array and byte range, in a generic one spanning pages)."""
  seen = {id(e)}
  while True:
    inner = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    if inner is None or id(inner) in seen:
      break
    seen.add(id(inner))
    e = inner
  text = (str(e).strip().splitlines() or [""])[0].split(" See full TensorStore details")[0]
  return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def verify_tree(checkpoint: str, tree, recorded: dict | None) -> Status:
  """Compares the digests of the restored arrays of ``tree`` (paths as at save; a
  partial restore checks its subset) with ``recorded`` (:func:`record`'s dict or None)."""
  if not recorded:
    return NoDigests(str(checkpoint))
  if recorded.get("algorithm") != ALGORITHM:
    return NoDigests(str(checkpoint), f"digest algorithm {recorded.get('algorithm')!r}, "
                     f"this code reads {ALGORITHM!r}")
  expected = recorded.get("arrays", {})
  found = tree_digests(tree)
  bad = [(p, expected.get(p, "(none recorded)"), d) for p, d in found.items()
         if expected.get(p) != d]
  if bad:
    return Corrupt(str(checkpoint), *bad[0], more=len(bad) - 1)
  return Ok(str(checkpoint), len(found))


@jax.jit
def _nonfinite_counts(arrays):
  return [jnp.sum(~jnp.isfinite(x), dtype=jnp.int32) if jnp.issubdtype(x.dtype, jnp.inexact)
          else jnp.zeros((), jnp.int32) for x in arrays]


def finite(status: Status, tree) -> Status:
  """``status``, or :class:`NonFinite` where it is usable (:class:`Ok`,
  :class:`NoDigests`) but a floating-point array of the restored ``tree`` holds NaN or
  infinite values (one jitted count per array, one transfer)."""
  if not isinstance(status, Ok | NoDigests):
    return status
  leaves = _leaves(tree)
  counts = jax.device_get(_nonfinite_counts([x for _, x in leaves]))
  bad = [(path, int(c)) for (path, _), c in zip(leaves, counts) if c]
  if bad:
    return NonFinite(status.checkpoint, *bad[0], more=len(bad) - 1)
  return status


def check(status: Status) -> None:
  """Nothing for :class:`Ok`; a warning for :class:`NoDigests`; raises
  :class:`CorruptCheckpointError`, :class:`ForeignCheckpointError` or
  :class:`IncompleteCheckpointError` otherwise."""
  if isinstance(status, NoDigests):
    warnings.warn(f"checkpoint {status.checkpoint} is {describe(status)}: its contents are "
                  "not verified", UnverifiedCheckpointWarning, stacklevel=3)
  elif isinstance(status, Corrupt | NonFinite):
    raise CorruptCheckpointError(status)
  elif isinstance(status, Foreign):
    raise ForeignCheckpointError(status)
  elif isinstance(status, Incomplete):
    raise IncompleteCheckpointError(status)


def file_sha256(path, chunk_bytes: int = 1 << 24) -> str:
  """The SHA-256 of a file, read in chunks (host side: for one-off conversions)."""
  h = hashlib.sha256()
  with open(pathlib.Path(path), "rb") as f:
    while block := f.read(chunk_bytes):
      h.update(block)
  return h.hexdigest()
