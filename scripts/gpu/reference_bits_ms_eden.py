"""Runs Quartet II's own MS-EDEN quantizer on fixed inputs and saves what it returns, for a
bit-level check of fp8jax's MS-EDEN (fp8jax/numerics/ms_eden.py) on a CPU afterwards.

Needs a CUDA GPU (compute capability 8.9 or later: the kernel casts to float8e4nv), torch
2.x with the Triton it ships, and a local clone of IST-DASLab/Quartet-II (no pip install
of it: its training code's Triton kernel is imported from the clone's ``src/``)::

    python scripts/gpu/reference_bits_ms_eden.py --clone /path/to/Quartet-II \
        --out ms_eden_reference.npz [--draws 64]
    python scripts/gpu/reference_bits_ms_eden.py --check ms_eden_reference.npz \
        [--subset tests/references/data/ms_eden_quartet2_h200.npz]

The reference is ``eden_1x16s_fp4_kernel_wrapper`` of
``src/models/quantization/quantizers/nvfp4_triton.py`` (commit 8776a90): MS-EDEN of an
already rotated tensor, 1 x 16 blocks, correction groups of ``hadamard_dim`` = 128, with
``scale_override = (17 / 16) * 0.93`` as ``schemes/quartet_2.py`` calls it for the backward
pass. It returns the dequantized tensor ``(q * scale) * D`` only (float32), and draws its
uniform numbers inside the kernel (``tl.rand`` from a seed of Python's ``random``), so the
saved file holds, for each input and each of ``--draws`` seeds, that output.

``--check FILE`` (CPU; fp8jax and ml_dtypes, no torch) compares the saved outputs, block
by block and bit for bit (the sign of zero included), with

* :func:`triton_model`, a NumPy emulation of the kernel as Triton compiles it: every
  float32 ``a / b`` is PTX ``div.full.f32``, taken as ``a * float32(1 / b)`` (measured:
  the recorded tensor levels are these, and ``(G / 255.99) / m`` is one ulp off on five
  of six inputs), E2M1 ties away from zero, the sign ``x > 0 ? 1 : -1`` (an element +0
  comes out -0), the group sums rounded once (``tl.sum``'s order follows its thread
  layout); its two candidates ``(q * down) * D`` and ``(q * up) * D`` per block;
* fp8jax's two candidates, and for a block that equals neither, the reason: the tensor
  level ``D``, the sign of zero (equal in value), the payload (a tie, or ``v`` one ulp
  apart at an E2M1 threshold), the scale pair ``down, up``.

and counts how often the upper candidate was drawn against ``sum (c - down) / (up - down)``
over the blocks whose two candidates differ. It exits 1 if a block matches neither the
emulation nor fp8jax up to the documented conventions. ``--subset OUT`` also writes the
few groups that tests/numerics/test_ms_eden.py checks (each input's group holding its
largest magnitude, so that the tensor level is the same, and randomly chosen others).

The repository's CUDA kernels (``kernels/``, ``rht128_quant_eden``) need building with
CUDA 13 for sm100/sm120 and do not run on an H100/H200; this script does not use them.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import random
import sys

import numpy as np

SCALE_OVERRIDE = (17 / 16) * 0.93


def inputs() -> dict[str, np.ndarray]:
  """Fixed float32 inputs [rows, cols], cols a multiple of 128: Gaussian, heavy-tailed,
  tiny, huge, a block of zeros and a tensor with one dominant outlier."""
  rng = np.random.default_rng(20260130)
  out = {
      "gauss": rng.standard_normal((256, 512)),
      "student_t3": rng.standard_t(3, (256, 512)),
      "tiny": rng.standard_normal((128, 256)) * 2.0**-20,
      "huge": rng.standard_normal((128, 256)) * 2.0**20,
  }
  z = rng.standard_normal((128, 256))
  z[:, :16] = 0.0
  out["zero_block"] = z
  o = rng.standard_normal((128, 256))
  o[5, 7] = 500.0
  out["outlier"] = o
  return {k: v.astype(np.float32) for k, v in out.items()}


def run_reference(clone: pathlib.Path, out: pathlib.Path, draws: int) -> None:
  import torch  # noqa: PLC0415  (GPU side only)

  # The kernel's file alone (it imports only torch and triton): the package's __init__
  # imports its baselines, which need fast_hadamard_transform.
  path = clone / "src" / "models" / "quantization" / "quantizers" / "nvfp4_triton.py"
  spec = importlib.util.spec_from_file_location("quartet2_nvfp4_triton", path)
  nvfp4_triton = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(nvfp4_triton)

  saved = {"scale_override": np.float64(SCALE_OVERRIDE)}
  for name, x in inputs().items():
    xt = torch.from_numpy(x).cuda()
    outs = []
    for d in range(draws):
      random.seed(1000 + d)  # the wrapper draws its kernel seed from Python's random
      y = nvfp4_triton.eden_1x16s_fp4_kernel_wrapper(
          xt, scale_override=SCALE_OVERRIDE, hadamard_dim=128, group_size=16,
          four_over_six=False)
      outs.append(y.float().cpu().numpy())
    saved[f"{name}/x"] = x
    saved[f"{name}/y"] = np.stack(outs)
  saved["torch_version"] = np.array(torch.__version__)
  saved["device"] = np.array(torch.cuda.get_device_name())
  np.savez_compressed(out, **saved)
  print(f"wrote {out}: {len(inputs())} inputs x {draws} draws")


F32 = np.float32
VAL_MAX = F32(6.0 / SCALE_OVERRIDE)
TIES = (0.25, 1.25, 2.5, 5.0)  # E2M1 midpoints where away-from-zero and nearest even differ


def _over(a, b) -> np.ndarray:
  """Triton's float32 ``a / b`` (``div.full.f32``): ``a`` times the float32 reciprocal."""
  with np.errstate(divide="ignore"):
    return (np.asarray(a, F32) * (F32(1.0) / np.asarray(b, F32))).astype(F32)


def _e4m3(v) -> np.ndarray:
  """``.to(tl.float8e4nv)`` (nearest even, saturating at 448) as uint8 bit patterns."""
  import ml_dtypes  # noqa: PLC0415

  return np.minimum(np.asarray(v, F32), F32(448)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def _e4m3_value(b) -> np.ndarray:
  import ml_dtypes  # noqa: PLC0415

  return np.asarray(b, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32)


def triton_model(x: np.ndarray) -> dict[str, np.ndarray]:
  """``eden_1x16s_fp4_kernel`` (``four_over_six=False``) on ``x`` [R, C] in NumPy: the tensor
  level ``D``, per block the scale ``sd``, the scaled values ``v`` and payload ``q``
  [R, C / 16, 16], the corrected scale ``c`` and its E4M3 neighbours ``down``, ``up``."""
  x = np.asarray(x, F32)
  r, c = x.shape
  g = F32(np.max(np.abs(x)))
  d = F32(1.0) if g == 0 else _over(_over(g, F32(255.99)), VAL_MAX)[()]
  xb = x.reshape(r, c // 16, 16)
  sd = _e4m3_value(_e4m3(_over(_over(np.max(np.abs(xb), -1), VAL_MAX), d)))
  sd = np.where(sd == 0, F32(1.0), sd)
  v = _over(xb, (sd * d).astype(F32)[..., None])
  a = np.abs(v)
  mag = np.select([a >= 5, a >= 3.5, a >= 2.5, a >= 1.75, a >= 1.25, a >= 0.75, a >= 0.25],
                  [6.0, 4.0, 3.0, 2.0, 1.5, 1.0, 0.5], 0.0).astype(F32)
  q = (mag * np.where(v > 0, F32(1), F32(-1))).astype(F32)
  vg, qg = v.reshape(r, c // 128, 128).astype(np.float64), q.reshape(r, c // 128, 128)
  num, den = np.sum(vg * vg, -1).astype(F32), np.sum(vg * qg, -1).astype(F32)
  corr = np.where(den == 0, F32(1.0), _over(num, np.where(den == 0, F32(1.0), den)))
  cs = (sd * np.repeat(corr, 8, -1)).astype(F32)
  b = _e4m3(cs).astype(np.int32)
  cur, prev, nxt = (_e4m3_value(np.clip(b + k, 0, 255)) for k in (0, -1, 1))
  up, down = np.where(cur > cs, cur, nxt), np.where(cur > cs, prev, cur)
  return {"d": d, "sd": sd, "v": v, "q": q, "c": cs, "down": down, "up": up}


def fp8jax_side(x: np.ndarray) -> dict[str, np.ndarray]:
  """fp8jax's ``D``, ``q`` [R, C / 16, 16] and the two E4M3 candidates of each block scale
  (the stochastic rounding with words that never round up, and that always do)."""
  import jax.numpy as jnp  # noqa: PLC0415

  from fp8jax.numerics import ms_eden  # noqa: PLC0415

  words = np.full((x.shape[0], x.shape[1] // 16), 0xFFFFFFFF, np.uint32)
  q, _, lo, d, _ = (np.asarray(v) for v in ms_eden.quantize_blocks(jnp.asarray(x),
                                                                   jnp.asarray(words)))
  hi = np.asarray(ms_eden.quantize_blocks(jnp.asarray(x), jnp.asarray(words * 0))[2])
  return {"d": F32(d), "q": q.reshape(*lo.shape, 16), "down": lo, "up": hi}


def candidates(side: dict) -> tuple[np.ndarray, np.ndarray]:
  """The two outputs ``(q * down) * D`` and ``(q * up) * D`` as uint32 bit patterns."""
  return tuple(((side["q"] * side[k][..., None]).astype(F32) * side["d"]).astype(F32)
               .view(np.uint32) for k in ("down", "up"))


def compare(x: np.ndarray, ys: np.ndarray) -> dict[str, int]:
  """Block counts over all draws of one input (see the module's docstring)."""
  model, ours = triton_model(x), fp8jax_side(x)
  (m_lo, m_hi), (f_lo, f_hi) = candidates(model), candidates(ours)
  pay = (ours["q"] != model["q"]).any(-1)  # values: -0 == +0
  tie = (np.isin(np.abs(model["v"]), TIES) & (ours["q"] != model["q"])).any(-1)
  pair = (ours["down"] != model["down"]) | (ours["up"] != model["up"])
  differ = (f_lo != f_hi).any(-1)
  p = (model["c"].astype(np.float64) - model["down"]) / np.where(
      model["up"] > model["down"], model["up"] - model["down"], 1.0)
  out = dict.fromkeys(("blocks", "model", "fp8jax", "level", "zero_sign", "tie", "payload",
                       "pair", "other", "ups", "trials"), 0)
  out["expected_ups"] = out["var_ups"] = 0.0
  for y in ys:
    yb = y.reshape(f_lo.shape).view(np.uint32)
    out["blocks"] += yb.shape[0] * yb.shape[1]
    out["model"] += int(((yb == m_lo).all(-1) | (yb == m_hi).all(-1)).sum())
    is_lo, is_hi = (yb == f_lo).all(-1), (yb == f_hi).all(-1)
    miss = ~(is_lo | is_hi)
    out["fp8jax"] += int((~miss).sum())
    yv = yb.view(F32)
    same_value = ((yv == f_lo.view(F32)).all(-1) | (yv == f_hi.view(F32)).all(-1))
    level = np.full(miss.shape, ours["d"] != model["d"])
    kinds = {"level": level, "zero_sign": ~level & same_value,
             "tie": ~level & ~same_value & tie, "payload": ~level & ~same_value & pay & ~tie}
    kinds["pair"] = ~level & ~same_value & ~pay & pair
    kinds["other"] = ~level & ~same_value & ~pay & ~pair
    for k, mask in kinds.items():
      out[k] += int((miss & mask).sum())
    out["ups"] += int((is_hi & differ).sum())
    out["trials"] += int(differ.sum())
    out["expected_ups"] += float(p[differ].sum())
    out["var_ups"] += float((p * (1 - p))[differ].sum())
  return out


def check(path: pathlib.Path, subset: pathlib.Path | None = None, groups: int = 32) -> int:
  data = np.load(path)
  bad = 0
  for name in sorted({k.split("/")[0] for k in data.files if "/" in k}):
    x, ys = data[f"{name}/x"], data[f"{name}/y"]
    c = compare(x, ys)
    n = c["blocks"]
    sd = max(np.sqrt(c["var_ups"]), 1.0)
    print(f"{name}: {n} blocks ({len(ys)} draws); the Triton model's candidates {c['model']}"
          f"/{n}, fp8jax's {c['fp8jax']}/{n} bit for bit; fp8jax's others: tensor level "
          f"{c['level']}, sign of zero {c['zero_sign']}, E2M1 tie {c['tie']}, payload "
          f"{c['payload']}, scale pair {c['pair']}, unexplained {c['other']}; upper drawn "
          f"{c['ups']} of {c['trials']} (expected {c['expected_ups']:.1f}, "
          f"z = {(c['ups'] - c['expected_ups']) / sd:+.2f})")
    bad += (n - c["model"]) + c["level"] + c["payload"] + c["pair"] + c["other"]
  if subset is not None:
    write_subset(data, subset, groups)
  return 1 if bad else 0


def write_subset(data, out: pathlib.Path, groups: int) -> None:
  """Per input ``groups`` groups of 128 (rows of ``{name}/x`` [groups, 128] and
  ``{name}/y`` [draws, groups, 128]): the group of the largest magnitude first, then
  groups drawn at random; ``{name}/where`` holds each one's (row, first column)."""
  rng = np.random.default_rng(0)
  saved = {k: data[k] for k in ("scale_override", "torch_version", "device")}
  for name in sorted({k.split("/")[0] for k in data.files if "/" in k}):
    x, ys = data[f"{name}/x"], data[f"{name}/y"]
    r, c = x.shape
    top = np.unravel_index(np.argmax(np.abs(x)), x.shape)
    first = top[0] * (c // 128) + top[1] // 128
    rest = rng.choice(np.delete(np.arange(r * c // 128), first), groups - 1, replace=False)
    pick = np.concatenate([[first], np.sort(rest)])
    saved[f"{name}/x"] = x.reshape(-1, 128)[pick]
    saved[f"{name}/y"] = ys.reshape(len(ys), -1, 128)[:, pick]
    saved[f"{name}/where"] = np.stack([pick // (c // 128), pick % (c // 128) * 128], -1)
  np.savez_compressed(out, **saved)
  print(f"wrote {out}: {groups} groups of 128 per input")


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clone", type=pathlib.Path, help="local clone of IST-DASLab/Quartet-II")
  p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("ms_eden_reference.npz"))
  p.add_argument("--draws", type=int, default=64)
  p.add_argument("--check", type=pathlib.Path, help="compare a saved file with fp8jax (CPU)")
  p.add_argument("--subset", type=pathlib.Path, help="with --check: write the test's subset")
  p.add_argument("--groups", type=int, default=32, help="groups of 128 per input in --subset")
  a = p.parse_args()
  if a.check:
    return check(a.check, a.subset, a.groups)
  if a.clone is None or not (a.clone / "src" / "models").is_dir():
    p.error("--clone must name a clone of IST-DASLab/Quartet-II (with src/models)")
  run_reference(a.clone, a.out, a.draws)
  return 0


if __name__ == "__main__":
  sys.exit(main())
