"""Fuzzed command lines: a binary given any flag values ends with exit status 0 or 2 and,
for 2, one line on stderr; never a traceback (experiments/_cli.py).

The flags come from the binaries' own sources (every ``flags.DEFINE_*`` of the module) and,
for ``train``, from every key of :func:`fp8jax.train.run_config.defaults` as a
``--config.<key>`` override. So that a valid command line ends quickly, ``train`` is given
a workdir that is a file, and ``compare`` and the other binaries an input that does not
exist: every command line is then an error, of the flags or of the path.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
_DEFINE = re.compile(r'flags\.DEFINE_\w+\(\s*"(\w+)"')


def _binary_flags(name: str) -> list[str]:
  return _DEFINE.findall((REPO / "experiments" / f"{name}.py").read_text())


def _config_keys() -> list[str]:
  from fp8jax.train import run_config  # pylint: disable=import-outside-toplevel

  def walk(tree, prefix):
    for key, value in tree.items():
      if isinstance(value, dict) and key != "model_overrides":
        yield from walk(value, f"{prefix}{key}.")
      else:
        yield f"{prefix}{key}"
  return list(walk(json.loads(run_config.defaults().to_json()), "config."))


VALUES = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "nan", "-1", "0", "1e309", "true", "False", "@@", "a,b", "0-3",
                     "seed", "bf16", "gemm:nosuch", "/", "..", "x" * 300]),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12))


def _run(args: list[str], cwd) -> subprocess.CompletedProcess:
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "FP8JAX_COMPILE_CACHE": "off"}
  return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                        env=env, cwd=cwd, timeout=120)


def _fuzzed(data, names: list[str]) -> list[str]:
  """One to three ``--NAME=VALUE`` flags drawn from ``names`` and :data:`VALUES`."""
  chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3))
  return [f"--{n}={data.draw(VALUES)}" for n in chosen]


def _check(out: subprocess.CompletedProcess) -> None:
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]


@pytest.mark.slow
@settings(max_examples=10)
@given(data=st.data())
def test_train_with_fuzzed_flags_and_overrides(tmp_path_factory, data):
  folder = tmp_path_factory.mktemp("fuzz")
  workdir = folder / "a_file"
  workdir.write_text("not a folder")
  names = [n for n in _binary_flags("train") if n not in ("workdir", "config")]
  args = _fuzzed(data, names + _config_keys())
  _check(_run(["fp8jax.experiments.train",
               f"--config={REPO / 'experiments/configs/train_tiny.py'}",
               f"--workdir={workdir}", *args], folder))


@pytest.mark.slow
@settings(max_examples=6)
@given(data=st.data())
def test_compare_with_fuzzed_flags(tmp_path_factory, data):
  folder = tmp_path_factory.mktemp("fuzz")
  missing = folder / "no_run"
  args = _fuzzed(data, [n for n in _binary_flags("compare") if n != "train_workdir"])
  _check(_run(["fp8jax.experiments.compare", f"--train_workdir={missing}",
               f"--out={folder / 'out'}", *args], folder))


# Binaries given a missing input, so that every fuzzed command line is an error: the
# fixed flags, and the flags left out of the fuzzing (those fixed, and ``--out`` where a
# valid value would start work).
_MISSING = {
    "branch": (["--train_workdir={m}", "--out={f}/out"], ("train_workdir", "out")),
    "verify": (["--workdir={m}"], ("workdir",)),
    "report": (["--results={m}"], ("results",)),
    "convert_hf": (["--hf_dir={m}", "--out={f}/out"], ("hf_dir", "out")),
    "compare_runs": (["--runs={m},{m}2", "--out={f}/out"], ("runs", "out")),
    "prepare_data": (["--input={m}.jsonl", "--out={f}/out"], ("input", "out")),
    "train_tokenizer": (["--input={m}.jsonl", "--out={f}/out"], ("input", "out")),
}


@pytest.mark.slow
@pytest.mark.parametrize("binary", sorted(_MISSING))
@settings(max_examples=3)
@given(data=st.data())
def test_other_binaries_with_fuzzed_flags(tmp_path_factory, binary, data):
  folder = tmp_path_factory.mktemp("fuzz")
  fixed, left_out = _MISSING[binary]
  fixed = [a.format(m=folder / "missing", f=folder) for a in fixed]
  args = _fuzzed(data, [n for n in _binary_flags(binary) if n not in left_out])
  _check(_run([f"fp8jax.experiments.{binary}", *fixed, *args], folder))
