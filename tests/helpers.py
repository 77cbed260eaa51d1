"""Shared test helpers: the spec-to-reference adapter and a tolerance check."""

import contextlib
import threading

import numpy as np

from tests.references import reference as ref


def ref_for_spec(x, spec):
  """(payload, scale_inv, dequantized) of the independent reference for ``spec``."""
  g = spec.granularity
  return ref.ref_quantize(
      np.asarray(x), spec.format, g.kind, g.axes, g.sizes, eps=spec.eps,
      margin=spec.margin, scale_format=spec.scale_format, rounding=spec.pow2_rounding,
      store_e8m0=spec.store_e8m0)


def assert_close(got, want):
  """Equal up to float32 summation-order rounding (a wiring error is ~1% off)."""
  want = np.asarray(want)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.max(np.abs(want)))


def flip_a_decodable_bit(folder, read) -> None:
  """Flips one bit of one of the Orbax data files under ``folder`` where ``read()`` (a read
  without verification, as readers did before digests) still decodes but returns other
  values: damage as a bad copy or disk leaves it. TensorStore's zstd chunks carry no
  checksum, so most single flips decode; the search tries the largest files first, at
  several offsets (which arrays a file holds varies between runs). Fails the test when no
  such flip exists."""
  import jax  # pylint: disable=import-outside-toplevel
  import pytest  # pylint: disable=import-outside-toplevel

  files = sorted((f for f in folder.rglob("ocdbt.process_*/d/*") if f.is_file()),
                 key=lambda f: -f.stat().st_size)
  before, tried = [np.asarray(x) for x in jax.tree.leaves(read())], []
  for f in files:
    data = f.read_bytes()
    for eighth in (4, 2, 6, 1, 3, 5, 7):
      damaged = bytearray(data)
      damaged[len(data) * eighth // 8] ^= 0x10
      f.write_bytes(bytes(damaged))
      try:
        after = jax.tree.leaves(read())
        if any(not np.array_equal(a, np.asarray(b), equal_nan=True)
               for a, b in zip(before, after)):
          return
        tried.append("unchanged")
      except Exception:  # pylint: disable=broad-except
        tried.append("does not decode")
      f.write_bytes(data)
  pytest.fail(f"no bit flip under {folder} decodes to other values: {tried}")


@contextlib.contextmanager
def held_elsewhere(folder):
  """``folder`` locked (fp8jax.data.folder_lock) by another thread, which counts as another
  writer, for the duration of the block."""
  from fp8jax.data import folder_lock  # pylint: disable=import-outside-toplevel
  holding, release = threading.Event(), threading.Event()

  def hold():
    with folder_lock.hold(folder):
      holding.set()
      release.wait(30)

  t = threading.Thread(target=hold)
  t.start()
  holding.wait(30)
  try:
    yield
  finally:
    release.set()
    t.join()
