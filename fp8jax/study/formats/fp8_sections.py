"""Computations of the FP8 numerics study: the studies and their sizes.

Four studies, each a function of :class:`StudySizes` returning JSON-ready rows:

* :func:`accumulation_error` - FP8 GEMM error against float64 as a function of K for
  FP32 accumulation and the tensor-core model with and without promotion (and
  :func:`fraction_bits_sweep`, the no-promotion error as the kept fraction bits vary);
* :func:`quantization_snr` - quantization SNR of each scaling granularity on
  activations with injected outliers, E4M3 and E5M2;
* :func:`double_quant_error` - error of the three transposed-operand policies with FP32
  and power-of-two scales;
* :func:`delayed_vs_current` - delayed vs current scaling when the range jumps, on a
  synthetic tensor and at a site of the tiny model
  (:func:`fp8jax.study.formats.model_site.delayed_at_model_site`).

:func:`run_all` runs them all into the JSON table that :mod:`fp8jax.study.formats.writeup`
turns into figures and markdown (``python -m fp8jax.experiments.formats`` is its binary).
The MX / NVFP4 sections are in :mod:`fp8jax.study.formats.mx_sections` (same sizes).
From a notebook, one study at chosen sizes::

  from fp8jax.study.formats import fp8_sections
  rows = fp8_sections.quantization_snr(fp8_sections.StudySizes(tokens=256, channels=512))
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import fp8jax
from fp8jax.gemm import accumulate, transpose
from fp8jax.study.formats import model_site


@dataclasses.dataclass(frozen=True)
class StudySizes:
  """Problem sizes; ``quick()`` gives a smoke-test configuration."""

  ks: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384)
  gemm_rows: int = 64
  fraction_bits: tuple[int, ...] = (11, 12, 13, 14, 15, 16, 17)
  tokens: int = 512
  channels: int = 1024
  outlier_ratios: tuple[float, ...] = (1e1, 1e2, 1e3, 1e4, 1e5, 1e6)
  steps: int = 8
  seed: int = 0
  # MX / NVFP4 sections (fp8jax.study.formats.mx_sections):
  format_ratios: tuple[float, ...] = (1, 4, 16, 64, 256, 1024)
  sr_keys: int = 512
  sr_trials: int = 32
  sr_ks: tuple[int, ...] = (256, 1024, 4096, 16384, 65536)
  rht_tokens: int = 4096
  rht_magnitudes: tuple[float, ...] = (1, 4, 16, 64, 256, 1024)

  @classmethod
  def quick(cls) -> StudySizes:
    return cls(ks=(256, 1024, 4096), gemm_rows=16, fraction_bits=(13, 15), tokens=128,
               channels=256, outlier_ratios=(1e2, 1e5), steps=5, format_ratios=(1, 64, 1024),
               sr_keys=128, sr_trials=16, sr_ks=(256, 4096), rht_tokens=512,
               rht_magnitudes=(1, 64))


# --- 1. accumulation error -------------------------------------------------------

DISTRIBUTIONS = {
    "gaussian": "A, B ~ N(0, 1): zero-mean products",
    "positive": "A, B ~ U(0, 1): all products positive",
    "outliers": "A ~ N(0, 1) with 1% of K-channels x100, B ~ N(0, 1)",
}
ACCUMULATORS = {
    "fp32": accumulate.FP32,
    "tc, no promotion": accumulate.HOPPER_NO_PROMOTION,
    "tc, promote every 128": accumulate.HOPPER,
}
_PER_TENSOR = fp8jax.QuantSpec(granularity=fp8jax.per_tensor())
_matmul = jax.jit(accumulate.scaled_matmul, static_argnums=2)


def gemm_operands(dist: str, rows: int, k: int, rng: np.random.Generator):
  """float32 A [rows, K], B [rows, K] drawn from distribution ``dist``."""
  if dist == "gaussian":
    return rng.standard_normal((rows, k)), rng.standard_normal((rows, k))
  if dist == "positive":
    return rng.uniform(0, 1, (rows, k)), rng.uniform(0, 1, (rows, k))
  if dist == "outliers":
    a = rng.standard_normal((rows, k))
    a[:, rng.choice(k, max(1, k // 100), replace=False)] *= 100.0
    return a, rng.standard_normal((rows, k))
  raise ValueError(f"unknown distribution {dist!r}; known: {sorted(DISTRIBUTIONS)}")


def error_metrics(y: np.ndarray, ref: np.ndarray) -> dict:
  """Relative errors of ``y`` against ``ref`` (float64 arrays of one shape)."""
  err = np.abs(y - ref)
  with np.errstate(divide="ignore", invalid="ignore"):
    rel = err / np.abs(ref)
  return {"max_rel": float(np.max(rel)), "p99_rel": float(np.quantile(rel, 0.99)),
          "median_rel": float(np.median(rel)),
          "norm_rel": float(np.linalg.norm(y - ref) / np.linalg.norm(ref)),
          "max_over_range": float(np.max(err) / np.max(np.abs(ref)))}


def _quantized(a, b):
  qa = fp8jax.quantize(jnp.asarray(a[None], jnp.float32), _PER_TENSOR)
  qb = fp8jax.quantize(jnp.asarray(b[None], jnp.float32), _PER_TENSOR)
  ref = np.asarray(fp8jax.dequantize(qa, jnp.float32), np.float64)[0] @ \
      np.asarray(fp8jax.dequantize(qb, jnp.float32), np.float64)[0].T
  return qa, qb, ref


def accumulation_error(sizes: StudySizes) -> list[dict]:
  """One row per (distribution, K, accumulator): error against float64.

  Operands are E4M3 with per-tensor scales (constant along K, so every accumulator
  applies); the reference is the float64 product of the same dequantized operands, so
  the rows measure accumulation error only.
  """
  rows = []
  rng = np.random.default_rng(sizes.seed)
  for dist in DISTRIBUTIONS:
    for k in sizes.ks:
      qa, qb, ref = _quantized(*gemm_operands(dist, sizes.gemm_rows, k, rng))
      for name, acc in ACCUMULATORS.items():
        y = np.asarray(_matmul(qa, qb, acc), np.float64)[0]
        rows.append({"distribution": dist, "k": k, "accumulator": name,
                     **error_metrics(y, ref)})
  return rows


def fraction_bits_sweep(sizes: StudySizes, k: int = 4096) -> list[dict]:
  """Error without promotion at ``k`` as the kept fraction bits vary."""
  rows = []
  rng = np.random.default_rng(sizes.seed + 1)
  for dist in ("gaussian", "positive"):
    qa, qb, ref = _quantized(*gemm_operands(dist, sizes.gemm_rows, k, rng))
    for bits in sizes.fraction_bits:
      acc = accumulate.Accumulation("tensor_core", fraction_bits=bits, promotion_interval=None)
      y = np.asarray(_matmul(qa, qb, acc), np.float64)[0]
      rows.append({"distribution": dist, "k": k, "fraction_bits": bits,
                   **error_metrics(y, ref)})
  return rows


# --- 2. quantization SNR ---------------------------------------------------------

GRANULARITIES = {
    "per-tensor": fp8jax.per_tensor(),
    "per-channel": fp8jax.per_axis(0),
    "per-token": fp8jax.per_axis(-1),
    "1x128": fp8jax.tile(128),
    "128x128": fp8jax.block((128, 128)),
}


def snr_db(x: np.ndarray, x_hat: np.ndarray) -> float:
  """10 log10(sum x^2 / sum (x - x_hat)^2), float64; inf when exact."""
  noise = np.sum((x - x_hat) ** 2)
  return float("inf") if noise == 0 else float(10 * np.log10(np.sum(x * x) / noise))


def outlier_activations(tokens: int, channels: int, ratio: float,
                        rng: np.random.Generator, frac: float = 1e-3):
  """N(0, 1) activations with a fraction ``frac`` of elements set to +-``ratio``.

  The seeds' [2, 3, 4, 500] example, generalised: ordinary values of order 1 share
  tensors, rows and tiles with rare values ``ratio`` times larger.

  Returns:
    ``(x, is_outlier)`` float32 [tokens, channels] and a boolean mask.
  """
  x = rng.standard_normal((tokens, channels))
  mask = rng.random((tokens, channels)) < frac
  x[mask] = ratio * rng.choice([-1.0, 1.0], int(mask.sum()))
  return x.astype(np.float32), mask


_fake = jax.jit(fp8jax.quantize_dequantize, static_argnums=1, static_argnames="telemetry")


def quantization_snr(sizes: StudySizes) -> list[dict]:
  """One row per (format, outlier ratio, granularity): SNR of the ordinary values."""
  rows = []
  rng = np.random.default_rng(sizes.seed + 2)
  for ratio in sizes.outlier_ratios:
    x, mask = outlier_activations(sizes.tokens, sizes.channels, ratio, rng)
    for fmt in ("e4m3", "e5m2"):
      for name, gran in GRANULARITIES.items():
        x_hat, tel = _fake(jnp.asarray(x), fp8jax.QuantSpec(format=fmt, granularity=gran),
                           telemetry=True)
        x_hat = np.asarray(x_hat, np.float64)
        rows.append({"format": fmt, "outlier_ratio": ratio, "granularity": name,
                     "bulk_snr_db": snr_db(x[~mask].astype(np.float64), x_hat[~mask]),
                     "snr_db": snr_db(x.astype(np.float64), x_hat),
                     "underflow_frac": float(tel.underflow_frac)})
  return rows


def seed_example() -> dict:
  """[2, 3, 4, 500] with one per-tensor scale, and split into two groups."""
  x = jnp.asarray([2.0, 3.0, 4.0, 500.0], jnp.float32)
  out = {"input": [2.0, 3.0, 4.0, 500.0]}
  for fmt in ("e4m3", "e5m2"):
    spec = fp8jax.QuantSpec(format=fmt, granularity=fp8jax.per_tensor())
    out[f"{fmt}_per_tensor"] = [float(v) for v in fp8jax.quantize_dequantize(x, spec)]
    grouped = fp8jax.quantize_dequantize(x, spec.replace(granularity=fp8jax.tile(3)))
    out[f"{fmt}_groups_of_3"] = [float(v) for v in grouped]
  return out


# --- 3. double quantization -----------------------------------------------------


def double_quant_error(sizes: StudySizes) -> list[dict]:
  """Transposed-operand error of each policy, FP32 vs power-of-two (rceil) scales.

  X [tokens, channels] has rows of different magnitude (10**U(-1, 1)); it is quantized
  with 1x128 tiles along channels, then needed with 1x128 tiles along tokens.
  """
  rng = np.random.default_rng(sizes.seed + 3)
  x = (rng.standard_normal((sizes.tokens, sizes.channels))
       * 10.0 ** rng.uniform(-1, 1, (sizes.tokens, 1))).astype(np.float32)
  xj = jnp.asarray(x)
  rows = []
  for scale_format in ("fp32", "pow2"):
    spec = fp8jax.QuantSpec(granularity=fp8jax.tile(128), scale_format=scale_format,
                            pow2_rounding="rceil" if scale_format == "pow2" else None)
    qt = fp8jax.quantize(xj, spec)
    single = np.asarray(fp8jax.dequantize(
        transpose.transposed(xj, qt, spec, "requant"), jnp.float32), np.float64)
    for policy in transpose.POLICIES:
      t = np.asarray(fp8jax.dequantize(
          transpose.transposed(xj, qt, spec, policy), jnp.float32), np.float64)
      rows.append({"scale_format": scale_format, "policy": policy,
                   "snr_db": snr_db(x.T.astype(np.float64), t),
                   "changed_vs_requant": float(np.mean(t != single)),
                   "changed_vs_forward_values": float(np.mean(
                       t != np.asarray(fp8jax.dequantize(qt, jnp.float32), np.float64).T))})
  return rows


# --- 4. delayed vs current scaling ------------------------------------------------


def range_schedule(steps: int) -> list[float]:
  """Per-step amax: steady at 240, a jump to 480 (the seeds' example), then 960."""
  base = [240.0, 240.0, 240.0, 480.0, 480.0, 960.0, 240.0, 240.0]
  return (base * (steps // len(base) + 1))[:steps]


def delayed_vs_current(sizes: StudySizes, history_len: int = 16) -> list[dict]:
  """One row per (step, scaling): saturated elements and SNR for an E4M3 tensor."""
  rng = np.random.default_rng(sizes.seed + 4)
  delayed_spec = fp8jax.QuantSpec(granularity=fp8jax.per_tensor(), scaling="delayed",
                                  history_len=history_len)
  current_spec = fp8jax.QuantSpec(granularity=fp8jax.per_tensor())
  history = fp8jax.quant.delayed.init_history(delayed_spec)
  rows = []
  for step, peak in enumerate(range_schedule(sizes.steps)):
    x = rng.uniform(-1, 1, 4096)
    x = (x / np.max(np.abs(x)) * peak).astype(np.float32)
    _, new_history = fp8jax.quantize_and_update(jnp.asarray(x), delayed_spec, history)
    for scaling, spec, hist in (("delayed", delayed_spec, history), ("current", current_spec,
                                                                      None)):
      x_hat, tel = _quantize_with_telemetry(x, spec, hist)
      rows.append({"step": step, "peak": peak, "scaling": scaling,
                   "saturated": int(round(float(tel.saturated_frac) * x.size)),
                   "saturated_frac": float(tel.saturated_frac),
                   "snr_db": snr_db(x.astype(np.float64), x_hat)})
    history = new_history
  return rows


def _quantize_with_telemetry(x, spec, history):
  x_hat, tel = fp8jax.quantize_dequantize(jnp.asarray(x), spec, history, telemetry=True)
  return np.asarray(x_hat, np.float64), tel


def seed_delayed_example() -> dict:
  """History max 240, current tensor [100, 200, 480, 150]: delayed vs current."""
  spec = fp8jax.QuantSpec(granularity=fp8jax.per_tensor(), scaling="delayed", history_len=4)
  history = jnp.asarray([240.0, 0, 0, 0], jnp.float32)
  x = jnp.asarray([100.0, 200.0, 480.0, 150.0], jnp.float32)
  delayed_hat, tel = fp8jax.quantize_dequantize(x, spec, history, telemetry=True)
  current_hat = fp8jax.quantize_dequantize(x, fp8jax.preset("current_tensor"))
  return {"input": [100.0, 200.0, 480.0, 150.0], "history_amax": 240.0,
          "delayed": [float(v) for v in delayed_hat],
          "delayed_saturated": int(round(float(tel.saturated_frac) * 4)),
          "current": [float(v) for v in current_hat]}


def run_all(sizes: StudySizes) -> dict:
  """Every study; the JSON table of the report."""
  return {
      "sizes": dataclasses.asdict(sizes),
      "backend": jax.default_backend(),
      "accumulation": accumulation_error(sizes),
      "fraction_bits": fraction_bits_sweep(sizes, k=max(k for k in sizes.ks if k <= 4096)),
      "quantization_snr": quantization_snr(sizes),
      "seed_example": seed_example(),
      "double_quant": double_quant_error(sizes),
      "delayed": delayed_vs_current(sizes),
      "seed_delayed_example": seed_delayed_example(),
      "delayed_model_site": model_site.delayed_at_model_site(
          range_schedule(sizes.steps), sizes.seed),
  }
