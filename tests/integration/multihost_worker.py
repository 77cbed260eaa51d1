"""Runs one fp8jax binary in this process and records what the process did, for
tests/integration/test_multihost.py.

    python tests/integration/multihost_worker.py RECORD_DIR WATCHED_DIR -m MODULE [FLAGS...]

The binary runs as ``python -m MODULE FLAGS`` would (under ``scripts/launch_local.py``
for several processes). On exit the worker writes ``RECORD_DIR/process_<i>.json``:

* ``exit``: the binary's exit status;
* ``writes``: every file this process opened for writing, renamed or removed under
  ``WATCHED_DIR`` (Python's audit hooks: the JSON, JSONL, Markdown and Orbax metadata
  writes; TensorStore's array writes from C++ are not seen);
* ``devices``, ``process_index``, ``process_count``;

and, as they are read (so that a killed process leaves them too), the training batches of
process ``i`` in ``RECORD_DIR/stream_<i>.jsonl``: one line per batch, the digests of its
rows (``fp8jax.train.loop.make_data`` wrapped).

With ``FP8JAX_TEST_HOLD_POSITION=I:S`` in the environment, process ``I`` stops for ten
minutes inside the save of its data position into any checkpoint after step ``S`` (so
that a test can kill it there, deterministically, in the middle of a save).
"""

import hashlib
import json
import os
import pathlib
import re
import runpy
import sys


def main():
  record_dir, watched = pathlib.Path(sys.argv[1]), os.path.realpath(sys.argv[2])
  assert sys.argv[3] == "-m", sys.argv
  module, flags = sys.argv[4], sys.argv[5:]
  writes = []
  record_dir.mkdir(parents=True, exist_ok=True)

  def audit(event, args):
    if event == "open":
      path, mode, flags_ = args
      writing = (mode is not None and any(c in mode for c in "wax+")) or (
          mode is None and isinstance(flags_, int) and flags_ & (os.O_WRONLY | os.O_RDWR))
      paths = [path] if writing else []
    elif event in ("os.rename", "os.remove", "os.unlink", "shutil.rmtree"):
      paths = [a for a in args[:2] if isinstance(a, str | bytes | os.PathLike)]
    else:
      return
    for p in paths:
      try:
        real = os.path.realpath(os.fsdecode(p))
      except (TypeError, ValueError):
        continue
      if real.startswith(watched + os.sep):
        writes.append([event, os.path.relpath(real, watched)])

  sys.addaudithook(audit)

  from fp8jax.train import loop  # pylint: disable=import-outside-toplevel

  make_data = loop.make_data

  def recording_make_data(*args, **kwargs):
    data = make_data(*args, **kwargs)
    fetch = data.__next__

    class Recorded:
      def __iter__(self):
        return self

      def __next__(self):
        import jax  # pylint: disable=import-outside-toplevel

        batch = fetch()
        line = json.dumps([hashlib.sha1(row.tobytes()).hexdigest()[:16] for row in batch])
        with open(record_dir / f"stream_{jax.process_index()}.jsonl", "a") as f:
          f.write(line + "\n")
        return batch

      def __getattr__(self, name):
        return getattr(data, name)

    return Recorded()

  loop.make_data = recording_make_data
  hold = os.environ.get("FP8JAX_TEST_HOLD_POSITION")
  if hold:
    _hold_position_save(*map(int, hold.split(":")))
  sys.argv = [module, *flags]
  code = 0
  try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  finally:
    import jax  # pylint: disable=import-outside-toplevel

    record = {"exit": code, "process_index": jax.process_index(),
              "process_count": jax.process_count(), "devices": len(jax.devices()),
              "writes": writes}
    (record_dir / f"process_{jax.process_index()}.json").write_text(json.dumps(record))
  sys.exit(code)


def _hold_position_save(process: int, after_step: int):
  """Process ``process`` sleeps before writing its position into checkpoints after
  ``after_step`` (the checkpoint folder's name starts with its step)."""
  import time  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel

  from fp8jax.train import data_positions  # pylint: disable=import-outside-toplevel

  save = data_positions.PositionsHandler.save

  def held(self, directory, args):
    steps = [int(m.group(1)) for part in pathlib.Path(str(directory)).parts
             if (m := re.match(r"(\d+)(\.|$)", part))]
    if jax.process_index() == process and steps and steps[-1] > after_step:
      time.sleep(600)
    return save(self, directory, args)

  data_positions.PositionsHandler.save = held


if __name__ == "__main__":
  main()
