"""Runs Transformer Engine's own NVFP4 reference quantizers on fixed inputs and saves what
they return, for a bit-level check of fp8jax on a CPU (tests/references/test_te_nvfp4_bits.py).

Two references of NVIDIA/TransformerEngine, neither installed (TE needs CUDA to build)::

    git -C TE show d0067d0d:transformer_engine/pytorch/custom_recipes/reference_nvfp4.py \
        > /tmp/reference_nvfp4.py
    git -C TE show b47e1f88:tests/cpp/operator/test_cast_nvfp4_transpose.cu > /tmp/te_cast.cu
    python scripts/reference/te_nvfp4_bits.py /tmp/reference_nvfp4.py --cpp /tmp/te_cast.cu \
        --cuda-include CUDA_INCLUDE [--out tests/references/data/te_nvfp4_reference.npz]

``CUDA_INCLUDE``: ``nvidia/cu13/include`` of the unpacked wheels ``nvidia-cuda-runtime``
(13.4 or later), ``nvidia-cuda-crt`` and ``nvidia-cuda-cccl`` (``pip download --no-deps``);
g++ compiles their host code, no GPU or nvcc needed.

* ``reference_nvfp4.py`` (PyTorch, CPU; commit d0067d0da6cb01811b8072a7d304f0e00344ce2b):
  ``NVFP4QuantizerRef(...).quantize(x)``, whose ``data``/``scale`` (and ``data_t``/
  ``scale_t`` for the transpose) and ``global_amax_row``/``_col`` are saved, for plain
  NVFP4 (1x16 and 16x16), row-scaled NVFP4 (``row_scaled_nvfp4=True``) and Four Over Six
  (``nvfp4_use_4over6``, MAE/MSE, E4M3 maximum 256/448, also 16x16 and row-scaled). Its
  imports of TE (``gemm``, ``reference_utils``, ``quantized_tensor``) are replaced by the
  few names it uses. Needs torch (CPU).
* UE5M3 is in no Python reference: PR #3325 (head b47e1f88b71134da6853d42c57ad5810f9802e68)
  checks its kernels against the C++ CPU reference of ``test_cast_nvfp4_transpose.cu``
  (``compute_ref`` -> ``quantize_nvfp4_1d<float, fp8ue5m3>``), whose UE5M3 cast is CUDA
  13.4's host ``__nv_fp8_ue5m3`` (``cuda_fp8.hpp``). This script cuts those functions out
  of the file unchanged, compiles them with g++ against ``--cuda-include`` (the
  ``nvidia-cuda-runtime`` and ``nvidia-cuda-cccl`` wheels' ``include``, 13.5.37 here) with
  a few stand-ins for TE's test helpers, and runs them (plain and row-scaled, E4M3 and
  UE5M3 block scales). Without ``--cpp`` the UE5M3 part is skipped.

Saved (``pack``: one flat array per dtype and a JSON index): the inputs, TE's payload
codes (two per byte, element ``2j`` in the low nibble, as TE stores them), block-scale
codes (uint8), tensor or row amax and its dequantized values, as ``dequantize_fp4_kernel``
(``common/cast/nvfp4/dequantize_nvfp4.cuh``) computes them (no reference returns them):
``fp4 * ((scale * amax) * float32(1 / (6 * E)))``, with ``amax`` the tensor's (row's).
"""

from __future__ import annotations

import argparse
import enum
import hashlib
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import types

import numpy as np

TE_COMMIT = "d0067d0da6cb01811b8072a7d304f0e00344ce2b"
TE_CPP_COMMIT = "b47e1f88b71134da6853d42c57ad5810f9802e68"  # PR #3325 head
OUT = pathlib.Path(__file__).resolve().parents[2] / "tests/references/data/te_nvfp4_reference.npz"
# name -> NVFP4QuantizerRef keyword arguments (all with rowwise and columnwise usage)
PY_VARIANTS = {
    "nvfp4": dict(quant_tile_shape=(1, 16)),
    "nvfp4_2d": dict(quant_tile_shape=(16, 16)),
    "row": dict(quant_tile_shape=(1, 16), row_scaled_nvfp4=True),
    "fos_mae256": dict(quant_tile_shape=(1, 16), nvfp4_use_4over6=True, nvfp4_e4m3_max=256),
    "fos_mse448": dict(quant_tile_shape=(1, 16), nvfp4_use_4over6=True, nvfp4_e4m3_max=448,
                       nvfp4_4over6_err_mode="MSE"),
    "fos_mae256_2d": dict(quant_tile_shape=(16, 16), nvfp4_use_4over6=True,
                          nvfp4_e4m3_max=256),
    "fos_mse256_row": dict(quant_tile_shape=(1, 16), nvfp4_use_4over6=True,
                           nvfp4_e4m3_max=256, nvfp4_4over6_err_mode="MSE",
                           row_scaled_nvfp4=True),
}
# name -> (block scale type, row-scaled) for the C++ reference
CPP_VARIANTS = {"cpp_ue5m3": ("fp8ue5m3", False), "cpp_ue5m3_row": ("fp8ue5m3", True),
                "cpp_e4m3": ("fp8e4m3", False)}


def inputs() -> dict[str, np.ndarray]:
  """Fixed float32 inputs [rows, cols] (cols even; rows even: TE packs two per byte)."""
  rng = np.random.default_rng(20260829)
  out = {}
  for seed in range(8):  # Gaussian rows over 40 binades of magnitude, a heavy tail
    r = np.random.default_rng(seed)
    x = r.standard_normal((16, 64)) * 2.0 ** r.uniform(-20, 20, (16, 1))
    if seed % 3 == 0:
      x *= np.abs(r.standard_t(2, (16, 64)))
    out[f"seed{seed}"] = x.astype(np.float32)
  # Exact E2M1 ties: G = 2688 makes S_enc = D = 1, a block maximum 6 makes its scale 1.
  ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], np.float32)
  t = np.tile(np.concatenate([ties, -ties]), (16, 4))
  t[0, 16:32] = 2688.0 / 2 ** np.arange(16)
  out["ties"] = t.astype(np.float32)
  z = rng.standard_normal((16, 64)).astype(np.float32)
  z[:, 16:32] = 0.0
  z[3] = 0.0  # an all-zero row: a row-scaled row of amax 0
  out["zero_blocks"] = z
  out["all_zero"] = np.zeros((16, 32), np.float32)
  # Block maxima far below the tensor's: E4M3 (and UE5M3) subnormal block scales and 0.
  s = rng.standard_normal((16, 64)).astype(np.float32)
  s *= (2.0 ** -np.arange(0, 64, 4, dtype=np.float32))[:, None]
  s[0, 0] = 1e4
  s[1, 16:32] *= 2.0**-60
  out["tiny_blocks"] = s
  out["odd_shape"] = (rng.standard_normal((6, 40)) * 3).astype(np.float32)
  sz = rng.standard_normal((16, 32)).astype(np.float32)
  sz[::2, ::3] = -0.0
  out["signed_zero"] = sz
  n = rng.standard_normal((16, 64)).astype(np.float32)
  n[2, 5], n[7, 40] = np.nan, np.inf
  n[9, 20] = -np.inf
  out["nonfinite"] = n
  return out


def load_reference(path: pathlib.Path):
  """TE's ``reference_nvfp4.py`` as a module, its TE imports replaced by stand-ins."""
  import torch

  class Quantizer:  # the two attributes the reference reads
    def __init__(self, *, rowwise=True, columnwise=True):
      self.rowwise_usage, self.columnwise_usage, self.internal = rowwise, columnwise, False

  stubs = {name: types.ModuleType(name) for name in (
      "transformer_engine", "transformer_engine.pytorch",
      "transformer_engine.pytorch.custom_recipes", "transformer_engine.pytorch.custom_recipes.gemm",
      "transformer_engine.pytorch.custom_recipes.reference_utils",
      "transformer_engine.pytorch.quantized_tensor")}
  gemm = stubs["transformer_engine.pytorch.custom_recipes.gemm"]
  gemm.GEMMType = enum.Enum("GEMMType", {"FPROP": "fprop", "DGRAD": "dgrad", "WGRAD": "wgrad"})
  gemm.MMParams = type("MMParams", (), {})
  utils = stubs["transformer_engine.pytorch.custom_recipes.reference_utils"]
  utils.Fp4Formats = enum.Enum("Fp4Formats", {"E2M1": "e2m1"})
  utils.HIGH_PRECISION_FLOAT_DTYPES = (torch.float, torch.float16, torch.bfloat16)
  utils.roundup_div = lambda x, y: (x + y - 1) // y
  qt = stubs["transformer_engine.pytorch.quantized_tensor"]
  qt.QuantizedTensorStorage, qt.Quantizer = type("QuantizedTensorStorage", (), {}), Quantizer
  recipes = stubs["transformer_engine.pytorch.custom_recipes"]
  recipes.gemm, recipes.reference_utils = gemm, utils
  sys.modules.update(stubs)
  spec = importlib.util.spec_from_file_location("te_reference_nvfp4", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def te_dequantize(codes: np.ndarray, scales: np.ndarray, amax: np.ndarray,
                  e: float) -> np.ndarray:
  """``dequantize_fp4_kernel``: ``fp4 * ((scale * amax) * float32(1 / (6 E)))`` in float32,
  ``codes`` [R, C] (0-15), ``scales`` float32 [R(+padding), ceil(C / 16)] (one row per row
  of data, as TE stores 16x16 blocks' scales too), ``amax`` [1] or [R]."""
  grid = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
  r, c = codes.shape
  sc = np.repeat(scales[:r], 16, 1)
  amax = amax.reshape(-1, 1).astype(np.float32)
  with np.errstate(all="ignore"):
    final = (sc[:, :c] * amax) * np.float32(1.0 / (6.0 * e))
    return grid[codes] * final


def unpack(packed: np.ndarray) -> np.ndarray:
  """[R, C/2] bytes (element 2j in the low nibble) -> [R, C] codes."""
  return np.stack([packed & 15, packed >> 4], -1).reshape(packed.shape[0], -1)


def run_python(ref, xs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  import torch

  out = {}
  for variant, kw in PY_VARIANTS.items():
    for case, x in xs.items():
      if (variant.endswith("_2d") and x.shape[0] % 16) or (
          case == "nonfinite" and variant.startswith("fos")):
        continue
      q = ref.NVFP4QuantizerRef(dtype=ref.reference_utils.Fp4Formats.E2M1, rowwise=True,
                                columnwise=True, **kw).quantize(torch.from_numpy(x))
      e = q.nvfp4_e4m3_max if kw.get("nvfp4_use_4over6") else 448
      k = f"{variant}.{case}"
      for side, data, scale, amax in (("row", q.data, q.scale, q.global_amax_row),
                                      ("col", q.data_t, q.scale_t, q.global_amax_col)):
        out[f"{k}.{side}.payload"] = data.numpy()
        out[f"{k}.{side}.scale"] = scale.view(torch.uint8).numpy()
        out[f"{k}.{side}.amax"] = amax.numpy()
      codes, sx = unpack(out[f"{k}.row.payload"]), scale_values(out[f"{k}.row.scale"])
      out[f"{k}.row.dequant"] = te_dequantize(codes, sx, out[f"{k}.row.amax"], e)
  return out


def scale_values(codes: np.ndarray, fmt: str = "e4m3") -> np.ndarray:
  """uint8 block-scale codes -> float32 (E4M3 by ml_dtypes-free bit arithmetic, UE5M3)."""
  c = codes.astype(np.int64)
  bias, e, m = (7, (c >> 3) & 15, c & 7) if fmt == "e4m3" else (15, c >> 3, c & 7)
  v = np.where(e == 0, m / 8 * 2.0 ** (1 - bias), (1 + m / 8) * 2.0 ** (e - bias))
  nan = (c & 0x7F) == 0x7F if fmt == "e4m3" else c == 0xFF
  return np.where(nan, np.nan, v).astype(np.float32)


HARNESS = r"""
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_fp4.h>
using bf16 = __nv_bfloat16; using fp8e4m3 = __nv_fp8_e4m3; using fp8ue5m3 = __nv_fp8_ue5m3;
using fp4e2m1x2 = __nv_fp4x2_e2m1;
template <typename T> struct Numeric_Traits;
template <> struct Numeric_Traits<float> { static constexpr float maxNorm = 3.402823466e+38F; };
template <> struct Numeric_Traits<bf16> { static constexpr float maxNorm = 3.38953139e38F; };
#define NVTE_CHECK(cond, ...) do { if (!(cond)) throw std::runtime_error(#cond); } while (0)
inline size_t divide_round_up(size_t a, size_t b) { return (a + b - 1) / b; }
enum NVTENVFP44Over6Mode { kNVTENVFP44Over6Disabled };
namespace {
@TE_FUNCTIONS@
template <typename S> int run(FILE *f, FILE *o, size_t rows, size_t cols, int row_scaled) {
  std::vector<float> x(rows * cols), amax(rows, 0.0f);
  if (fread(x.data(), 4, x.size(), f) != x.size()) return 1;
  float g = 0.0f;
  for (size_t i = 0; i < rows; ++i) for (size_t j = 0; j < cols; ++j) {
    amax[i] = fmaxf(amax[i], fabsf(x[i * cols + j])); g = fmaxf(g, fabsf(x[i * cols + j])); }
  if (!row_scaled) amax.assign(1, g);
  const size_t nb = divide_round_up(cols, 16), nbt = divide_round_up(rows, 16);
  std::vector<fp4e2m1x2> q(rows * cols / 2), qt(rows * cols / 2);
  std::vector<S> s(rows * nb), st(cols * nbt);
  compute_ref<float, S>([](const float v) { return v; }, x.data(), q.data(), qt.data(),
                        s.data(), st.data(), amax.data(), rows, cols, nb, nbt, false, false,
                        row_scaled != 0, false, std::is_same_v<S, fp8e4m3> ? 448 : 114688);
  fwrite(q.data(), 1, q.size(), o); fwrite(s.data(), 1, s.size(), o);
  return 0;
}
}  // namespace
int main(int argc, char **argv) {
  FILE *f = fopen(argv[1], "rb"), *o = fopen(argv[2], "wb");
  const size_t rows = std::stoul(argv[3]), cols = std::stoul(argv[4]);
  const int row_scaled = std::stoi(argv[5]);
  return std::string(argv[6]) == "fp8ue5m3" ? run<fp8ue5m3>(f, o, rows, cols, row_scaled)
                                            : run<fp8e4m3>(f, o, rows, cols, row_scaled);
}
"""


def build_cpp(cu: pathlib.Path, include: pathlib.Path, work: pathlib.Path) -> pathlib.Path:
  """TE's CPU reference functions, cut out of ``cu`` unchanged, compiled with a harness."""
  text = cu.read_text()
  start = text.index("double2 cvt_fp4x2_to_double2")
  end = re.search(r"\nvoid compare_nvfp4_tensors", text).start()
  src = work / "te_nvfp4_ref.cpp"
  src.write_text(HARNESS.replace("@TE_FUNCTIONS@", text[start:end]))
  exe = work / "te_nvfp4_ref"
  subprocess.run(["g++", "-std=c++17", "-O1", "-ffp-contract=off", "-fno-fast-math",
                  "-w", f"-I{include}", str(src), "-o", str(exe)], check=True)
  return exe


def run_cpp(exe: pathlib.Path, xs: dict[str, np.ndarray], work: pathlib.Path) -> dict:
  out = {}
  for variant, (stype, row) in CPP_VARIANTS.items():
    for case, x in xs.items():
      # no padding in the C++ reference (whole 16-element blocks only), no NaN/inf here
      if case in ("nonfinite", "odd_shape") or (
          variant == "cpp_e4m3" and "seed" not in case):
        continue
      (work / "x.bin").write_bytes(np.ascontiguousarray(x, np.float32).tobytes())
      subprocess.run([str(exe), str(work / "x.bin"), str(work / "o.bin"), str(x.shape[0]),
                      str(x.shape[1]), str(int(row)), stype], check=True)
      raw = np.frombuffer((work / "o.bin").read_bytes(), np.uint8)
      n = x.size // 2
      k = f"{variant}.{case}.row"
      out[f"{k}.payload"] = raw[:n].reshape(x.shape[0], -1)
      out[f"{k}.scale"] = raw[n:].reshape(x.shape[0], -1)
      amax = np.max(np.abs(x), axis=1) if row else np.max(np.abs(x)).reshape(1)
      out[f"{k}.amax"] = amax.astype(np.float32)
      e = 448.0 if stype == "fp8e4m3" else 114688.0
      fmt = "e4m3" if stype == "fp8e4m3" else "ue5m3"
      out[f"{k}.dequant"] = te_dequantize(unpack(out[f"{k}.payload"]),
                                          scale_values(out[f"{k}.scale"], fmt), amax, e)
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("reference", type=pathlib.Path, help="TE's reference_nvfp4.py")
  ap.add_argument("--cpp", type=pathlib.Path, help="PR #3325's test_cast_nvfp4_transpose.cu")
  ap.add_argument("--cuda-include", type=pathlib.Path, help="CUDA >= 13.4 include folder")
  ap.add_argument("--out", type=pathlib.Path, default=OUT)
  args = ap.parse_args(argv)
  xs = inputs()
  data = {f"input.{k}": v for k, v in xs.items()}
  data.update(run_python(load_reference(args.reference), xs))
  meta = {"te_commit": TE_COMMIT, "reference": "transformer_engine/pytorch/custom_recipes/"
          "reference_nvfp4.py", "reference_sha256":
          hashlib.sha256(args.reference.read_bytes()).hexdigest()}
  if args.cpp is not None:
    with tempfile.TemporaryDirectory() as tmp:
      exe = build_cpp(args.cpp, args.cuda_include, pathlib.Path(tmp))
      data.update(run_cpp(exe, xs, pathlib.Path(tmp)))
    meta.update(te_cpp_commit=TE_CPP_COMMIT, cpp="tests/cpp/operator/"
                "test_cast_nvfp4_transpose.cu", cpp_sha256=hashlib.sha256(
                    args.cpp.read_bytes()).hexdigest())
  args.out.parent.mkdir(parents=True, exist_ok=True)
  np.savez_compressed(args.out, **pack(data), meta=np.array(json.dumps(meta, sort_keys=True)))
  print(f"{args.out}: {len(data)} arrays, {args.out.stat().st_size} bytes")
  return 0


def pack(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The arrays concatenated flat, one array per dtype (``pool.<dtype>``), with an index
  ``{key: [dtype, offset, shape]}`` (``index``, JSON): a few hundred small arrays cost a
  zip header each."""
  pools: dict[str, list[np.ndarray]] = {}
  index = {}
  for key, v in sorted(data.items()):
    v = np.asarray(v)
    parts = pools.setdefault(v.dtype.name, [])
    index[key] = [v.dtype.name, sum(p.size for p in parts), list(v.shape)]
    parts.append(v.ravel())
  out = {f"pool.{d}": np.concatenate(parts) for d, parts in pools.items()}
  return {**out, "index": np.array(json.dumps(index, sort_keys=True))}


if __name__ == "__main__":
  sys.exit(main())
