r"""Numerics demo: how scaling granularity and format handle activation outliers.

Builds activations [tokens, channels] ~ N(0, 1) with a few outlier channels (the
LLM pattern behind the seeds' [2, 3, 4, 500] example), quantizes them with every
granularity in E4M3 and E5M2, and prints SNR, saturation and underflow::

  python -m fp8jax.experiments.demo
  python -m fp8jax.experiments.demo --outlier=1000 --json_out=/tmp/table.json
"""

from __future__ import annotations

import json

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

import fp8jax

_TOKENS = flags.DEFINE_integer("tokens", 1024, "Rows (tokens) of the activation.")
_CHANNELS = flags.DEFINE_integer("channels", 1024, "Columns (channels).")
_OUTLIER = flags.DEFINE_float("outlier", 500.0, "Magnitude of the outlier channels.")
_N_OUTLIERS = flags.DEFINE_integer("outlier_channels", 4, "Number of outlier channels.")
_SEED = flags.DEFINE_integer("seed", 0, "Random seed.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the rows as JSON here.")

GRANULARITIES = {
    "per-tensor": fp8jax.per_tensor(),
    "per-token (rowwise)": fp8jax.per_axis(-1),
    "per-channel": fp8jax.per_axis(0),
    "1x128 tiles": fp8jax.tile(128),
    "128x128 blocks": fp8jax.block((128, 128)),
    "1x32 tiles, E8M0": fp8jax.tile(32),
}


def outlier_activations(tokens: int, channels: int, outlier: float, n_outliers: int,
                        seed: int) -> tuple[jax.Array, np.ndarray]:
  """float32 [tokens, channels] ~ N(0, 1) with ``n_outliers`` channels scaled up.

  Returns:
    ``(x, bulk)``: the activations and a boolean mask [channels] of the ordinary
    (non-outlier) channels.
  """
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((tokens, channels)).astype(np.float32)
  cols = rng.choice(channels, size=min(n_outliers, channels), replace=False)
  x[:, cols] *= outlier / 3.0  # |N(0,1)| rarely exceeds 3: peaks near `outlier`
  bulk = np.ones(channels, bool)
  bulk[cols] = False
  return jnp.asarray(x), bulk


def snr_db(x: jax.Array, x_hat: jax.Array) -> float:
  """10 log10(sum x^2 / sum (x - x_hat)^2) in float64."""
  x = np.asarray(x, np.float64)
  noise = np.sum((x - np.asarray(x_hat, np.float64)) ** 2)
  return float("inf") if noise == 0 else float(10 * np.log10(np.sum(x * x) / noise))


def quantization_table(x: jax.Array, bulk: np.ndarray,
                       formats=("e4m3", "e5m2")) -> list[dict]:
  """One row of telemetry per (format, granularity) for activation ``x``.

  ``bulk_snr_db`` is the SNR over the ordinary channels only (mask ``bulk``): the
  whole-tensor SNR is dominated by the outlier channels.
  """
  rows = []
  for fmt in formats:
    for name, gran in GRANULARITIES.items():
      e8m0 = "E8M0" in name
      spec = fp8jax.QuantSpec(format=fmt, granularity=gran,
                              scale_format="pow2" if e8m0 else "fp32",
                              pow2_rounding="rceil" if e8m0 else None, store_e8m0=e8m0)
      x_hat, tel = jax.jit(fp8jax.quantize_dequantize, static_argnums=1,
                           static_argnames="telemetry")(x, spec, telemetry=True)
      rows.append({"format": fmt, "granularity": name, "spec": spec.describe(),
                   "bulk_snr_db": snr_db(x[:, bulk], x_hat[:, bulk]),
                   **{k: float(v) for k, v in vars(tel).items()}})
  return rows


def format_table(rows: list[dict]) -> str:
  """Fixed-width text table of ``quantization_table`` rows."""
  head = f"{'format':6} {'granularity':20} {'SNR dB':>7} {'bulk SNR':>8} " \
         f"{'saturated %':>11} {'underflow %':>11} {'scale min':>10} {'scale max':>10}"
  lines = [head, "-" * len(head)]
  for r in rows:
    lines.append(
        f"{r['format']:6} {r['granularity']:20} {r['snr_db']:7.2f} "
        f"{r['bulk_snr_db']:8.2f} "
        f"{100 * r['saturated_frac']:11.4f} {100 * r['underflow_frac']:11.4f} "
        f"{r['scale_min']:10.3g} {r['scale_max']:10.3g}")
  return "\n".join(lines)


def main(argv):
  del argv
  x, bulk = outlier_activations(_TOKENS.value, _CHANNELS.value, _OUTLIER.value,
                          _N_OUTLIERS.value, _SEED.value)
  print(f"activations {tuple(x.shape)}: N(0,1) with {_N_OUTLIERS.value} outlier "
        f"channels near {_OUTLIER.value:g} (amax {float(jnp.max(jnp.abs(x))):.1f}); "
        f"backend {jax.default_backend()}\n")
  rows = quantization_table(x, bulk)
  print(format_table(rows))
  print("\nSNR: whole tensor (dominated by the outlier channels, whose largest value "
        "per block is exact);\nbulk SNR: ordinary channels only. underflow: non-zero "
        "values flushed to zero.")
  if _JSON_OUT.value:
    with open(_JSON_OUT.value, "w") as f:
      json.dump(rows, f, indent=1)
    print(f"wrote {_JSON_OUT.value}")


if __name__ == "__main__":
  app.run(main)
