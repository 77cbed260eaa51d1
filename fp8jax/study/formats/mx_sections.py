"""The MX / NVFP4 sections of the numerics study: outliers, stochastic rounding, the RHT.

Each study is a function of :class:`fp8jax.study.formats.fp8_sections.StudySizes` returning
JSON-ready rows (:func:`run_all` collects them; :mod:`fp8jax.study.formats.mx_writeup`
draws and describes them):

* :func:`format_outlier_snr` - quantize-dequantize SNR (overall, ordinary channels, outlier
  channels) and saturated fraction of each format as outlier channels grow;
* :func:`sr_bias` - per-element bias of round-to-nearest vs stochastic rounding, in units
  of the local rounding step, over many independent keys; :func:`sr_sum_error` - error of
  a long sum of quantized values as K grows (:func:`growth_exponent` fits its slope);
* :func:`hadamard_wgrad` - error of a Wgrad product ``X^T dY`` (contraction over the
  tokens) with and without the 16-point random Hadamard transform;
  :func:`hadamard_exactness` - the transform alone, without quantization.

From a notebook::

  from fp8jax.study.formats import mx_sections, fp8_sections
  rows = mx_sections.sr_bias(fp8_sections.StudySizes.quick())
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

import fp8jax
from fp8jax.gemm import hadamard
from fp8jax.numerics import blocks
from fp8jax.study.formats.fp8_sections import StudySizes, error_metrics, snr_db

_fake = jax.jit(fp8jax.quantize_dequantize, static_argnums=1, static_argnames="telemetry")


def spec_of(preset: str, **changes) -> fp8jax.QuantSpec:
  """The forward spec of a preset (cotangent spec dropped), with ``changes``."""
  return fp8jax.preset(preset).replace(backward=None, **changes)


# --- 1. formats under outlier channels ---------------------------------------------

FORMATS = {
    "fp8 per-tensor": "current_tensor",
    "deepseek-v3 1x128": "deepseek_v3",
    "mxfp8": "mxfp8",
    "mxfp8_ocp": "mxfp8_ocp",
    "mxfp6_e2m3": "mxfp6_e2m3",
    "mxfp4": "mxfp4",
    "mxfp4_rceil": "mxfp4_rceil",
    "nvfp4": "nvfp4",
}
"""Row name -> preset of the outlier study (tiles along the channels, the last axis)."""


def channel_outliers(tokens: int, channels: int, rng: np.random.Generator,
                     frac: float = 0.01):
  """N(0, 1) activations [tokens, channels] (float64) and a boolean channel mask
  [channels] marking ``max(1, round(frac * channels))`` outlier channels."""
  x = rng.standard_normal((tokens, channels))
  mask = np.zeros(channels, bool)
  mask[rng.choice(channels, max(1, round(frac * channels)), replace=False)] = True
  return x, mask


def format_outlier_snr(sizes: StudySizes) -> list[dict]:
  """One row per (format, outlier ratio r): the outlier channels multiplied by r.

  SNRs in dB over all elements, the ordinary (``bulk``) and the outlier channels;
  ``saturated_frac``: fraction of elements the saturating cast clipped;
  ``bulk_shared_frac``: fraction of the ordinary elements sharing a block with an outlier.
  """
  x0, mask = channel_outliers(sizes.tokens, sizes.channels, np.random.default_rng(sizes.seed + 5))
  rows = []
  for ratio in sizes.format_ratios:
    x = (x0 * np.where(mask, ratio, 1.0)).astype(np.float32)
    x64 = x.astype(np.float64)
    for name, preset in FORMATS.items():
      spec = spec_of(preset)
      x_hat, tel = _fake(jnp.asarray(x), spec, telemetry=True)
      x_hat = np.asarray(x_hat, np.float64)
      width = spec.granularity.block_shape(x.shape)[-1]
      rows.append({"format": name, "spec": spec.describe(), "outlier_ratio": float(ratio),
                   "bulk_shared_frac": _shared(mask, width),
                   "snr_db": snr_db(x64, x_hat),
                   "bulk_snr_db": snr_db(x64[:, ~mask], x_hat[:, ~mask]),
                   "outlier_snr_db": snr_db(x64[:, mask], x_hat[:, mask]),
                   "saturated_frac": float(tel.saturated_frac),
                   "underflow_frac": float(tel.underflow_frac)})
  return rows


def _shared(mask: np.ndarray, width: int) -> float:
  """Fraction of the ordinary channels that share a block of ``width`` channels with an
  outlier channel."""
  pad = np.concatenate([mask, np.zeros(-mask.size % width, bool)])
  hit = np.repeat(pad.reshape(-1, width).any(axis=1), width)[:mask.size]
  return float(np.sum(hit & ~mask) / max(np.sum(~mask), 1))


# --- 2. stochastic rounding --------------------------------------------------------

SR_FORMATS = {"nvfp4": ("nvfp4", "nvfp4_sr"), "mxfp4": ("mxfp4", None),
              "mxfp4_rceil": ("mxfp4_rceil", None)}
"""Format -> (round-to-nearest preset, stochastic preset or None: the RN preset with
``rounding="stochastic"``). The study measures the nearly unbiased 24-bit rounding
(``sr_bits=24``), also where the preset uses the hardware's 8 bits."""


def sr_specs() -> dict[tuple[str, str], fp8jax.QuantSpec]:
  """``(format, rounding) -> spec`` for the stochastic-rounding studies."""
  out = {}
  for name, (rn, sr) in SR_FORMATS.items():
    out[(name, "nearest")] = spec_of(rn)
    out[(name, "stochastic")] = (spec_of(sr, sr_bits=24) if sr
                                 else spec_of(rn, rounding="stochastic"))
  return out


@functools.partial(jax.jit, static_argnums=2)
def _draws(x, keys, spec):
  """x_hat for each key [n, *x.shape] and the per-element dequantization multiplier
  [*x.shape] (scales do not depend on the rounding mode or the key)."""
  qt = fp8jax.quantize(x, spec, key=keys[0])
  mult = blocks.broadcast_blocks(qt.scale_inv.astype(jnp.float32), qt.full_block, qt.shape)
  if qt.tensor_scale_inv is not None:
    mult = mult * qt.tensor_scale_inv
  return jax.vmap(lambda k: fp8jax.quantize_dequantize(x, spec, key=k))(keys), mult


def _step(x: np.ndarray, mult: np.ndarray, fmt):
  v = np.abs(np.asarray(x, np.float64)) / np.asarray(mult, np.float64)
  with np.errstate(divide="ignore"):
    e = np.maximum(np.floor(np.log2(v)), math.log2(fmt.min_normal))
  return 2.0 ** (e - fmt.mantissa_bits) * mult, v <= fmt.max


def rounding_step(x: np.ndarray, spec: fp8jax.QuantSpec):
  """The grid spacing of ``spec`` at each element of ``x`` [...], in x's units (float64),
  and a boolean mask of the elements within the format's range (|x * s| <= max: not
  saturated)."""
  x = np.asarray(x, np.float32)
  return _step(x, _draws(jnp.asarray(x), jax.random.split(jax.random.key(0), 1), spec)[1],
               spec.fmt)


def hoeffding_steps(n_draws: int, n_elements: int, delta: float = 1e-3) -> float:
  """Bound t (in rounding steps) with P(any of ``n_elements`` means of ``n_draws``
  unbiased draws, each within one step, is off by more than t) <= ``delta``."""
  return math.sqrt(math.log(2 * n_elements / delta) / (2 * n_draws))


def sr_bias(sizes: StudySizes, shape: tuple[int, int] = (8, 512)) -> list[dict]:
  """One row per (format, rounding): bias of x_hat over ``sizes.sr_keys`` keys.

  x ~ N(0, 1) of ``shape``; bias_i = mean_k x_hat_i(k) - x_i in units of the local
  rounding step, over the elements within range (saturated elements, whose bias is the
  clipping, are counted apart). ``hoeffding_steps``: the bound that every in-range
  unbiased element satisfies with probability 0.999.
  """
  x = np.random.default_rng(sizes.seed + 6).standard_normal(shape).astype(np.float32)
  keys = jax.random.split(jax.random.key(sizes.seed + 6), sizes.sr_keys)
  rows = []
  for (name, rounding), spec in sr_specs().items():
    x_hat, mult = _draws(jnp.asarray(x), keys, spec)  # RN: sr_keys equal copies
    n = sizes.sr_keys if rounding == "stochastic" else 1
    bias = np.mean(np.asarray(x_hat, np.float64)[:n], axis=0) - x.astype(np.float64)
    step, ok = _step(x, np.asarray(mult), spec.fmt)
    b = np.abs(bias) / step
    rows.append({"format": name, "rounding": rounding, "keys": n, "elements": int(x.size),
                 "in_range_frac": float(np.mean(ok)),
                 "mean_abs_bias_steps": float(np.mean(b[ok])),
                 "max_abs_bias_steps": float(np.max(b[ok])),
                 "saturated_mean_abs_bias_steps": float(np.mean(b[~ok])) if (~ok).any()
                 else 0.0,
                 "hoeffding_steps": hoeffding_steps(n, int(ok.sum()))
                 if rounding == "stochastic" else None})
  return rows


SUM_DISTRIBUTIONS = {
    "zero-mean": "N(0, 1)",
    "narrow positive": "1 + 0.1 N(0, 1): a mean-dominated signal",
    "log-normal": "exp(N(0, 1)): positive, heavy-tailed",
}


def sum_inputs(dist: str, trials: int, k: int, rng: np.random.Generator) -> np.ndarray:
  """float32 [trials, k] drawn from ``dist`` (a key of :data:`SUM_DISTRIBUTIONS`)."""
  if dist == "zero-mean":
    x = rng.standard_normal((trials, k))
  elif dist == "narrow positive":
    x = 1.0 + 0.1 * rng.standard_normal((trials, k))
  elif dist == "log-normal":
    x = np.exp(rng.standard_normal((trials, k)))
  else:
    raise ValueError(f"unknown distribution {dist!r}; known: {sorted(SUM_DISTRIBUTIONS)}")
  return x.astype(np.float32)


def sr_sum_error(sizes: StudySizes) -> list[dict]:
  """One row per (distribution, format, rounding, K): error of sum_k Q(x_k) vs float64.

  x is one [trials, max K] tensor quantized once (tiles along K, a fresh key for SR);
  the sum over the first K elements of each row is compared with the exact sum. ``bias``
  is the mean error over the trials, ``bias_z`` its ratio to its standard error;
  ``in_range_*`` restrict the error to the elements that did not saturate.
  """
  rng = np.random.default_rng(sizes.seed + 7)
  kmax, rows = max(sizes.sr_ks), []
  for d, dist in enumerate(SUM_DISTRIBUTIONS):
    x = sum_inputs(dist, sizes.sr_trials, kmax, rng)
    exact = np.cumsum(x.astype(np.float64), axis=1)
    for (name, rounding), spec in sr_specs().items():
      keys = jax.random.split(jax.random.key(sizes.seed * 1000 + d), 1)
      x_hat, mult = _draws(jnp.asarray(x), keys, spec)
      err = np.asarray(x_hat[0], np.float64) - x
      ok = _step(x, np.asarray(mult), spec.fmt)[1]
      total, in_range = np.cumsum(err, axis=1), np.cumsum(np.where(ok, err, 0.0), axis=1)
      for k in sizes.sr_ks:
        e, e_in = total[:, k - 1], in_range[:, k - 1]
        rows.append({"distribution": dist, "format": name, "rounding": rounding, "k": k,
                     "bias": float(np.mean(e)), "bias_z": _z(e),
                     "rms": float(np.sqrt(np.mean(e * e))),
                     "rel_rms": float(np.sqrt(np.mean(e * e) / np.mean(exact[:, k - 1] ** 2))),
                     "in_range_bias": float(np.mean(e_in)), "in_range_bias_z": _z(e_in)})
  return rows


def _z(e: np.ndarray) -> float:
  """mean / standard error (0 when every value is equal)."""
  se = np.std(e, ddof=1) / math.sqrt(e.size)
  return float(np.mean(e) / se) if se > 0 else 0.0


def growth_exponent(rows: list[dict], **match) -> float:
  """Least-squares slope of log(rms) against log(K) over the matching sum rows."""
  sel = [r for r in rows if all(r[k] == v for k, v in match.items())]
  return float(np.polyfit(np.log([r["k"] for r in sel]), np.log([r["rms"] for r in sel]), 1)[0])


# --- 3. the random Hadamard transform on Wgrad operands ----------------------------

HADAMARD_FORMATS = ("nvfp4", "mxfp4")
RHT_SIZE = 16
_WGRAD_CHANNELS = 128


def wgrad_operands(tokens: int, rng: np.random.Generator):
  """X [tokens, 128] (float64) with a boolean mask [tokens] of its outlier tokens (1/64
  of them, the ones a magnitude m multiplies), and dY [tokens, 128] (float32); N(0, 1).

  Outlier tokens share the 16-token blocks of the Wgrad operands with ordinary tokens:
  the case the transform along the tokens is for. (Outlier channels are not mixed by it;
  with a few of them the normwise error is an estimate over a few rows of dW, whose
  with/without-transform difference changes sign from seed to seed.)
  """
  x = rng.standard_normal((tokens, _WGRAD_CHANNELS))
  dy = rng.standard_normal((tokens, _WGRAD_CHANNELS)).astype(np.float32)
  mask = np.zeros(tokens, bool)
  mask[rng.choice(tokens, max(1, tokens // 64), replace=False)] = True
  return x, mask, dy


_rht = jax.jit(functools.partial(hadamard.random_hadamard, size=RHT_SIZE, signs="random",
                                 seed=0, dtype="float32"))
"""The transform in float32 with seeded signs: the study measures the transform's own
effect on the quantization, free of the recipe's BF16 rounding."""


def _wgrad_cases(sizes: StudySizes):
  """Yields (m, X^T, dY^T as float32 jax arrays [128, tokens], float64 X^T dY)."""
  x0, mask, dy = wgrad_operands(sizes.rht_tokens, np.random.default_rng(sizes.seed + 8))
  for m in sizes.rht_magnitudes:
    x = (x0 * np.where(mask, m, 1.0)[:, None]).astype(np.float32)
    ref = x.T.astype(np.float64) @ dy.astype(np.float64)
    yield float(m), jnp.asarray(x.T), jnp.asarray(dy.T), ref


def hadamard_wgrad(sizes: StudySizes) -> list[dict]:
  """One row per (outlier magnitude m, format, with/without the RHT).

  Both operands X^T and dY^T [128, tokens] are quantized along the tokens (round to
  nearest), after the 16-point transform along the tokens or not; the product of the
  dequantized operands (in float64) is compared with the float64 X^T dY.
  """
  rows = []
  for m, xt, dyt, ref in _wgrad_cases(sizes):
    for name in HADAMARD_FORMATS:
      spec = spec_of(name)
      for rht in (False, True):
        a, b = (_rht(xt), _rht(dyt)) if rht else (xt, dyt)
        a_hat, b_hat = (np.asarray(_fake(v, spec), np.float64) for v in (a, b))
        rows.append({"magnitude": m, "format": name, "hadamard": rht,
                     **error_metrics(a_hat @ b_hat.T, ref)})
  return rows


def hadamard_exactness(sizes: StudySizes) -> list[dict]:
  """One row per outlier magnitude m: the transform without quantization.

  ``rel_diff``: ||(X^T Q)(dY^T Q)^T - X^T dY|| / ||X^T dY||, the transformed float32
  operands multiplied in float64 (0 in exact arithmetic); ``f32_gemm_rel_err``: the same
  norm for the plain float32 GEMM X^T dY, for scale; ``unit_roundoff``: 2**-24.
  """
  rows = []
  for m, xt, dyt, ref in _wgrad_cases(sizes):
    a, b = (np.asarray(_rht(v), np.float64) for v in (xt, dyt))
    f32 = (np.asarray(xt) @ np.asarray(dyt).T).astype(np.float64)
    norm = np.linalg.norm(ref)
    rows.append({"magnitude": m, "rel_diff": float(np.linalg.norm(a @ b.T - ref) / norm),
                 "f32_gemm_rel_err": float(np.linalg.norm(f32 - ref) / norm),
                 "unit_roundoff": 2.0**-24})
  return rows


def run_all(sizes: StudySizes) -> dict:
  """Every study of this module: the tables it adds to the numerics JSON."""
  return {"formats_snr": format_outlier_snr(sizes), "sr_bias": sr_bias(sizes),
          "sr_sum": sr_sum_error(sizes), "hadamard": hadamard_wgrad(sizes),
          "hadamard_exact": hadamard_exactness(sizes)}
