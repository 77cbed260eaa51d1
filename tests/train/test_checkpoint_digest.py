"""Checkpoint digests: the formula against NumPy, its sensitivity, and damaged checkpoints
in training (--resume), the comparison sweep and the verify binary.

Damage is done to the files as a bad copy or disk would: one flipped bit in a data file of
a checkpoint's state where it still decodes, to other numbers (zstd has no checksum there;
:func:`tests.helpers.flip_a_decodable_bit`), or data files cut in half (do not decode).
"""

import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest

from fp8jax.study import sweep_report
from fp8jax.study.common import results, results_io
from fp8jax.study.comparison import sweep
from fp8jax.train import checkpoint, checkpoint_digest, loop, optim, run_config, verify
from fp8jax.train import mesh as mesh_lib
from tests import helpers

M32 = 0xFFFFFFFF
WINDOWS = sweep.Windows(offsets=(0,), batches=1, batch_size=4)
DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16, np.int32, np.uint32, np.int16, np.int8,
          np.uint8, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.bool_, np.float64,
          np.int64]


# --- an independent NumPy implementation of the digest --------------------------------

def ref_fmix32(h):
  """MurmurHash3's 32-bit finaliser on uint64 arrays holding uint32 values."""
  h = h ^ (h >> np.uint64(16))
  h = (h * np.uint64(0x85EBCA6B)) & np.uint64(M32)
  h = h ^ (h >> np.uint64(13))
  h = (h * np.uint64(0xC2B2AE35)) & np.uint64(M32)
  return h ^ (h >> np.uint64(16))


def ref_digest(x) -> str:
  """hex8(fmix32(A ^ n)) + hex8(fmix32(B + n)) with, over the element words w_i at flat
  positions i, A = sum w_i (2i + 1) 0x9E3779B1 and B = sum fmix32(w_i ^ fmix32(i +
  0x7F4A7C15)), everything mod 2**32."""
  x = np.ascontiguousarray(x).reshape(-1)
  if x.dtype == np.bool_:
    w = x.astype(np.uint64)
  else:
    w = x.view({1: "<u1", 2: "<u2", 4: "<u4", 8: "<u4"}[x.dtype.itemsize]).astype(np.uint64)
  i = np.arange(w.size, dtype=np.uint64)
  weight = ((2 * i + 1) * np.uint64(0x9E3779B1)) & np.uint64(M32)
  a = int(np.sum((w * weight) & np.uint64(M32), dtype=np.uint64)) & M32
  b = int(np.sum(ref_fmix32(w ^ ref_fmix32((i + np.uint64(0x7F4A7C15)) & np.uint64(M32))),
                 dtype=np.uint64)) & M32
  n = np.uint64(w.size & M32)
  return (f"{int(ref_fmix32(np.uint64(a) ^ n)):08x}"
          f"{int(ref_fmix32((np.uint64(b) + n) & np.uint64(M32))):08x}")


def random_array(dtype, shape, seed: int) -> np.ndarray:
  """Random bits of ``dtype`` (NaN payloads and subnormals included)."""
  rng = np.random.default_rng(seed)
  if dtype == np.bool_:
    return rng.integers(0, 2, shape).astype(np.bool_)
  nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
  return rng.integers(0, 256, nbytes, dtype=np.uint8).view(dtype).reshape(shape)


arrays = st.builds(random_array, st.sampled_from(DTYPES),
                   st.lists(st.integers(0, 9), max_size=3).map(tuple), st.integers(0, 2**32))


@pytest.mark.slow
@given(st.lists(arrays, min_size=1, max_size=3))
def test_digest_matches_the_numpy_reference(leaves):
  tree = {"a": {str(i): x for i, x in enumerate(leaves)}}
  want = {f"a/{i}": ref_digest(x) for i, x in enumerate(leaves)}
  assert checkpoint_digest.tree_digests(tree) == want
  narrow = {k: x for k, x in tree["a"].items() if x.dtype.itemsize <= 4}  # JAX without x64
  on_device = checkpoint_digest.tree_digests({"a": jax.tree.map(jnp.asarray, narrow)})
  assert on_device == {f"a/{k}": want[f"a/{k}"] for k in narrow}


def test_digest_changes_with_one_bit_swapped_words_a_zeroed_block_or_the_size():
  x = random_array(np.float32, (64, 33), 1)
  x[0, 1], x[0, 2] = 1.5, -1.5  # words differing in the top bit only: lane A alone misses
  base = ref_digest(x)
  assert checkpoint_digest.tree_digests({"x": x})["x"] == base
  changed = []
  for index, bit in [((0, 0), 0), ((31, 7), 31), ((63, 32), 16)]:
    y = x.copy()
    y.view(np.uint32)[index] ^= np.uint32(1 << bit)
    changed.append(y)
  for a, b in [((0, 1), (0, 2)), ((5, 5), (40, 20))]:
    y = x.copy()
    y[a], y[b] = x[b], x[a]
    changed.append(y)
  y = x.copy()
  y[10:12] = 0
  changed += [y, x.reshape(-1)[:-1]]
  h = random_array(ml_dtypes.bfloat16, (7,), 2)  # 16-bit elements, odd count
  h2 = h.copy()
  h2.view(np.uint16)[3] ^= np.uint16(1)
  got = checkpoint_digest.tree_digests({"c": changed, "h": [h, h2]})
  assert all(got[f"c/{i}"] != base for i in range(len(changed)))
  assert got["h/0"] != got["h/1"]


def test_legacy_checkpoint_loads_with_a_warning_and_restores_cast_after_verifying(tmp_path):
  state = {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4), "n": jnp.int32(3)}
  legacy = checkpoint.Checkpointer(tmp_path / "legacy", save_every=1, digests=False)
  legacy.save(0, state, {}, {}, force=True)
  legacy.wait()
  with pytest.warns(checkpoint_digest.UnverifiedCheckpointWarning, match="no digests"):
    got, _, meta = legacy.restore(0, checkpoint.abstract_like(state))
  assert "digests" not in meta and isinstance(legacy.verify(0, checkpoint.abstract_like(
      state)), checkpoint_digest.NoDigests)
  legacy.close()
  ckpt = checkpoint.Checkpointer(tmp_path / "new", save_every=1)
  ckpt.save(0, state, {}, {}, force=True)
  ckpt.wait()
  target = {"w": jax.ShapeDtypeStruct((3, 4), jnp.bfloat16), "n": jax.ShapeDtypeStruct(
      (), jnp.int32)}
  got, _, meta = ckpt.restore(0, target)  # read as float32, verified, then cast
  assert got["w"].dtype == jnp.bfloat16 and meta["digests"]["dtypes"]["w"] == "float32"
  assert ckpt.verify(0, target) == checkpoint_digest.Ok(str(tmp_path / "new" / "0"), 2)
  ckpt.close()


def test_verify_calls_a_checkpoint_holding_nan_corrupt(tmp_path):
  """Arrays that restore as saved, digests and all, but hold NaN or inf: verify's status is
  NonFinite (a corrupt checkpoint to the binaries), naming the first array."""
  state = {"a": jnp.ones((3,), jnp.float32), "b": jnp.array([1.0, jnp.nan, jnp.inf]),
           "c": jnp.array([jnp.nan], jnp.bfloat16), "n": jnp.int32(3)}
  ckpt = checkpoint.Checkpointer(tmp_path / "nan", save_every=1)
  ckpt.save(0, state, {}, {}, force=True)
  ckpt.wait()
  status = ckpt.verify(0, checkpoint.abstract_like(state))
  ckpt.close()
  assert status == checkpoint_digest.NonFinite(str(tmp_path / "nan" / "0"), "b", 2, more=1)
  assert checkpoint_digest.describe(status) == (
      "corrupt: array b holds 2 NaN or infinite values (and 1 more arrays)")
  assert not verify.is_usable(status)
  with pytest.raises(checkpoint_digest.CorruptCheckpointError, match="holds 2 NaN"):
    checkpoint_digest.check(status)


# --- damaged checkpoints of a training run -----------------------------------------------

def data_files(step_dir: pathlib.Path) -> list[pathlib.Path]:
  """The data files of a checkpoint's state, largest first."""
  files = (step_dir / "state").rglob("ocdbt.process_*/d/*")
  return sorted((f for f in files if f.is_file()), key=lambda f: -f.stat().st_size)


def flip_a_bit(step_dir: pathlib.Path, item: str | None = None) -> None:
  """One flipped bit that still decodes, in the state (or its ``item``, e.g. params)."""
  def read():
    state = ocp.PyTreeCheckpointer().restore(step_dir / "state")
    return state if item is None else state[item]
  helpers.flip_a_decodable_bit(step_dir / "state", read)


def truncate(step_dir: pathlib.Path, count: int = 1) -> None:
  """The largest ``count`` data files cut in half (they no longer decode)."""
  for f in data_files(step_dir)[:count]:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def copy_run(train_run, dst: pathlib.Path) -> pathlib.Path:
  shutil.copytree(train_run, dst)
  return dst


def recorded_digests(step_dir: pathlib.Path) -> dict:
  return json.loads((step_dir / "meta" / "metadata").read_text())["digests"]["arrays"]


@pytest.mark.slow
@pytest.mark.parametrize("damage, kind", [(flip_a_bit, "corrupt"), (truncate, "incomplete")])
def test_resume_sets_a_damaged_last_checkpoint_aside_and_says_so(train_run, tmp_path, damage,
                                                                 kind):
  run = copy_run(train_run, tmp_path / "run")
  damage(run / "checkpoints" / "4")
  cfg = ml_collections.ConfigDict(json.loads((run / "config.json").read_text()))
  out = io.StringIO()
  loop.train(cfg, run, resume=True, stream=out)
  said = out.getvalue()
  assert f"checkpoint {run / 'checkpoints' / '4'} is {kind}" in said, said
  assert f"moved it to {run / 'checkpoints' / '4'}.{kind}" in said
  assert "resuming from the previous checkpoint, step 2" in said
  if kind == "corrupt":
    assert re.search(r"array (params|opt_state)/\S+ has digest [0-9a-f]{16}, its save "
                     r"recorded [0-9a-f]{16}", said), said
  # Retrained from step 2: bit for bit what was saved before the damage.
  again, before = run / "checkpoints" / "4", train_run / "checkpoints" / "4"
  assert recorded_digests(again) == recorded_digests(before)
  assert (run / "checkpoints" / f"4.{kind}").is_dir()


def edit_position(path: pathlib.Path, **change) -> None:
  position = json.loads(path.read_text())
  path.write_text(json.dumps({**position, **change}))


@pytest.mark.slow
def test_data_positions_are_verified_like_the_arrays(train_run, tmp_path):
  """An edited data position (a positions file, or the copy in the data item) is a corrupt
  checkpoint for verify and for --resume, named by its file."""
  run = copy_run(train_run, tmp_path / "run")
  four, two = run / "checkpoints" / "4", run / "checkpoints" / "2"
  edit_position(four / "positions" / "process_0-of-1.json", step=5)
  edit_position(two / "data" / "metadata", step=1)
  statuses = dict(verify.verify_run(run))
  assert isinstance(statuses[0], checkpoint_digest.Ok)
  said = {s: checkpoint_digest.describe(statuses[s]) for s in (2, 4)}
  assert said[4].startswith(f"corrupt: data position {four}/positions/process_0-of-1.json "
                            "has digest "), said
  assert said[2].startswith(f"corrupt: data position {two}/data/metadata has digest "), said
  cfg = ml_collections.ConfigDict(json.loads((run / "config.json").read_text()))
  with pytest.raises(checkpoint_digest.CorruptCheckpointError,
                     match=f"checkpoint {four} is corrupt: data position {four}/positions/"):
    loop.train(cfg, run, resume=True, stream=io.StringIO())
  assert not list((run / "checkpoints").glob("*.corrupt"))  # both bad: nothing moved
  shutil.copytree(train_run / "checkpoints" / "2", two, dirs_exist_ok=True)  # a good 2
  out = io.StringIO()
  loop.train(cfg, run, resume=True, stream=out)
  assert "positions/process_0-of-1.json has digest" in out.getvalue()
  assert "resuming from the previous checkpoint, step 2" in out.getvalue()
  assert recorded_digests(four) == recorded_digests(train_run / "checkpoints" / "4")


@pytest.mark.slow
def test_sweep_and_verify_refuse_damaged_checkpoints_and_skip_them_when_asked(train_run,
                                                                             tmp_path):
  run = copy_run(train_run, tmp_path / "run")
  flip_a_bit(run / "checkpoints" / "2", "params")  # the sweep reads the params only
  truncate(run / "checkpoints" / "4", count=99)
  out = tmp_path / "cmp"
  kw = dict(policies=["bf16"], windows=WINDOWS)
  with pytest.raises(checkpoint_digest.CorruptCheckpointError,
                     match=rf"checkpoint {run}/checkpoints/2 is corrupt: array params/\S+ has "
                           r"digest [0-9a-f]{16}, its save recorded [0-9a-f]{16}"):
    sweep.run(run, out, steps=[2], **kw)
  with pytest.raises(checkpoint_digest.IncompleteCheckpointError,
                     match=rf"checkpoint {run}/checkpoints/4 is incomplete"):
    sweep.run(run, out, steps=[4], **kw)
  assert results_io.read(out / "rows.jsonl") == []
  log = io.StringIO()
  summary = sweep.run(run, out, skip_corrupt=True, stream=log, **kw)
  assert sorted(summary["skipped"]) == [2, 4] and summary["rows_written"] == 2  # bf16, floor
  assert "skipping checkpoint 2" in log.getvalue() and "skipping checkpoint 4" in log.getvalue()
  assert {r["step"] for r in results_io.read(out / "rows.jsonl")} == {0}
  assert {r["step"] for r in results_io.read(out / "baseline.jsonl")} == {0}

  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  cmp = subprocess.run([sys.executable, "-m", "fp8jax.experiments.compare",
                        f"--train_workdir={run}", f"--out={tmp_path / 'cmp2'}",
                        "--policies=bf16", "--batches=1", "--batch_size=4"],
                       env=env, capture_output=True, text=True, timeout=300)
  last = cmp.stderr.strip().splitlines()[-1]
  assert cmp.returncode == 2 and last.startswith("error: checkpoint "), cmp.stderr[-3000:]
  assert "/checkpoints/2 is corrupt: array params/" in last and "Traceback" not in cmp.stderr
  assert {r["step"] for r in results_io.read(tmp_path / "cmp2" / "rows.jsonl")} == {0}

  ver = subprocess.run([sys.executable, "-m", "fp8jax.experiments.verify", f"--workdir={run}"],
                       env=env, capture_output=True, text=True, timeout=300)
  lines = ver.stdout.strip().splitlines()
  assert ver.returncode == 1 and len(lines) == 3, ver.stdout + ver.stderr[-3000:]
  assert re.fullmatch(rf"{run}/checkpoints/0: ok \(\d+ arrays verified\)", lines[0])
  assert lines[1].startswith(f"{run}/checkpoints/2: corrupt: array params/")
  assert lines[2].startswith(f"{run}/checkpoints/4: incomplete: does not restore (")


@pytest.mark.slow
def test_a_nonfinite_baseline_is_a_data_problem_not_an_fp8_row(train_run, tmp_path):
  """A checkpoint whose params are NaN (verified: it was saved that way) gets its baseline
  line, no FP8 row, and its own section of the report."""
  run = copy_run(train_run, tmp_path / "run")
  ckpt = checkpoint.Checkpointer(run / "checkpoints", save_every=1)
  cfg = ml_collections.ConfigDict(json.loads((run / "config.json").read_text()))
  tx = optim.optimizer(run_config.optim_config(cfg))
  _, abstract, sharding = loop.state_layout(cfg, run_config.model(cfg), tx,
                                            mesh_lib.data_mesh())
  state, position, meta = ckpt.restore(4, loop.restore_target(abstract, sharding))
  params = dict(state.params, lm_head={"kernel": state.params["lm_head"]["kernel"] * jnp.nan})
  ckpt.save(6, state._replace(params=params), position, meta, force=True)
  ckpt.wait()
  ckpt.close()
  out = tmp_path / "cmp"
  kw = dict(policies=["bf16", "attn_l0_e4m3"], windows=WINDOWS, steps=[6])
  assert sweep.run(run, out, **kw)["rows_written"] == 0
  (base,) = results_io.read(out / "baseline.jsonl")
  assert base["step"] == 6 and not base["finite"] and base["nonfinite"].startswith("grads/")
  assert results_io.read(out / "rows.jsonl") == []
  assert sweep.run(run, out, **kw)["rows_written"] == 0  # nothing left to do
  md = "\n".join(sweep_report.grid_markdown(results.load(out)))
  assert "## Non-finite rows\n\nNone." in md
  assert "## Non-finite BF16 baselines (data problem)" in md and "| 6 | 0 | 0 | grads/" in md
