"""Runs Quartet II's own MS-EDEN quantizer on fixed inputs and saves what it returns, for a
bit-level check of fp8jax's MS-EDEN (fp8jax/numerics/ms_eden.py) on a CPU afterwards.

Needs a CUDA GPU (compute capability 8.9 or later: the kernel casts to float8e4nv), torch
2.x with the Triton it ships, and a local clone of IST-DASLab/Quartet-II (no pip install
of it: its training code's Triton kernel is imported from the clone's ``src/``)::

    python scripts/gpu/reference_bits_ms_eden.py --clone /path/to/Quartet-II \
        --out ms_eden_reference.npz [--draws 64]

The reference is ``eden_1x16s_fp4_kernel_wrapper`` of
``src/models/quantization/quantizers/nvfp4_triton.py`` (commit 8776a90): MS-EDEN of an
already rotated tensor, 1 x 16 blocks, correction groups of ``hadamard_dim`` = 128, with
``scale_override = (17 / 16) * 0.93`` as ``schemes/quartet_2.py`` calls it for the backward
pass. It returns the dequantized tensor ``q * scale * s_dec`` only, and draws its uniform
numbers inside the kernel (``tl.rand`` from a seed of Python's ``random``), so the saved
file holds, for each input and each of ``--draws`` seeds, that output (float32); the check
(``--check FILE`` on the CPU, fp8jax installed, no torch needed) recomputes fp8jax's
payload ``q``, tensor level and the two E4M3 neighbours ``down <= c_b <= up`` of each
corrected block scale, and counts the blocks whose reference output equals
``(q * down) * D`` or ``(q * up) * D`` bit for bit, and how often the upper one was drawn
(over many draws, near ``(c_b - down) / (up - down)``). Blocks whose payload differs
(a tie or a one-ulp difference of the scaled value near an E2M1 threshold: Triton rounds
ties away from zero and divides by the scale, fp8jax rounds to even and multiplies by the
reciprocal, as Quartet II's CUDA kernel does) are counted separately.

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


def check(path: pathlib.Path) -> int:
  import jax.numpy as jnp  # noqa: PLC0415

  from fp8jax.numerics import ms_eden  # noqa: PLC0415

  data = np.load(path)
  bad = 0
  for name in sorted({k.split("/")[0] for k in data.files if "/" in k}):
    x, ys = data[f"{name}/x"], data[f"{name}/y"]
    words_down = np.full((x.shape[0], x.shape[1] // 16), 0xFFFFFFFF, np.uint32)
    q, _, lo, d, _ = (np.asarray(v) for v in ms_eden.quantize_blocks(
        jnp.asarray(x), jnp.asarray(words_down)))
    _, _, hi, _, _ = (np.asarray(v) for v in ms_eden.quantize_blocks(
        jnp.asarray(x), jnp.asarray(np.zeros_like(words_down))))
    qb = q.reshape(*lo.shape, 16)
    cand_lo = (qb * lo[..., None]) * np.float32(d)
    cand_hi = (qb * hi[..., None]) * np.float32(d)
    exact = ups = n = 0
    for y in ys:
      yb = y.reshape(*lo.shape, 16)
      is_lo = (yb == cand_lo).all(-1)
      is_hi = (yb == cand_hi).all(-1)
      exact += int((is_lo | is_hi).sum())
      ups += int((is_hi & ~is_lo).sum())
      n += is_lo.size
    print(f"{name}: {exact}/{n} blocks equal one of fp8jax's two candidates bit for bit; "
          f"upper chosen {ups} times")
    bad += n - exact
  return 1 if bad else 0


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clone", type=pathlib.Path, help="local clone of IST-DASLab/Quartet-II")
  p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("ms_eden_reference.npz"))
  p.add_argument("--draws", type=int, default=64)
  p.add_argument("--check", type=pathlib.Path, help="compare a saved file with fp8jax (CPU)")
  a = p.parse_args()
  if a.check:
    return check(a.check)
  if a.clone is None or not (a.clone / "src" / "models").is_dir():
    p.error("--clone must name a clone of IST-DASLab/Quartet-II (with src/models)")
  run_reference(a.clone, a.out, a.draws)
  return 0


if __name__ == "__main__":
  sys.exit(main())
