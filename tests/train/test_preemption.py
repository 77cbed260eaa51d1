"""The SIGTERM watch of preemption (fp8jax/train/preemption.py) in a process of its own.
(Preemption and exact resume of a run: test_run_control.py.)"""

import os
import subprocess
import sys


def test_watch_survives_a_native_library_replacing_its_handler(tmp_path):
  """A C-level SIGTERM handler set behind Python's back (as a native library may) is
  undone at the next step boundary: the notice is caught instead of ending the process."""
  code = (
      "import ctypes, os, signal\n"
      "from fp8jax.train import preemption\n"
      "class Manager:\n"
      "  def reached_preemption(self, step): return False\n"
      "libc = ctypes.CDLL(None)\n"
      "libc.signal.restype = ctypes.c_void_p\n"
      "libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]\n"
      "with preemption.Watch(Manager()) as watch:\n"
      "  libc.signal(signal.SIGTERM, None)  # SIG_DFL, unseen by Python\n"
      "  assert not watch.reached(1)\n"
      "  os.kill(os.getpid(), signal.SIGTERM)\n"
      "  print('caught', watch.reached(2))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
  assert out.stdout.split() == ["caught", "True"]
