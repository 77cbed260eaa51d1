"""Model FLOPs and model FLOPs utilisation (MFU) of training.

Model FLOPs per token are the model's own count (:attr:`fp8jax.models.api.Model.
flops_per_token`: forward + backward = 3 x forward, as in PaLM's MFU); DeepSeek-MoE's is
:func:`fp8jax.models.deepseek_model.flops_per_token`. Padding, recomputation and the
simulated low-precision arithmetic are not model FLOPs, so they lower MFU.
"""

from __future__ import annotations

from fp8jax.models import api

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, by device kind.
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12),
             ("B200", 2250e12), ("A100", 312e12), ("L40S", 362e12), ("A10G", 70e12))


def flops_per_token(model: api.Model, seq_len: int) -> float:
  """Training model FLOPs per token of ``model`` at sequence length ``seq_len`` (0.0: the
  model does not say)."""
  return float(model.flops_per_token(seq_len))


def peak_flops(device_kind: str) -> float | None:
  """The dense bf16 peak of one device of ``device_kind`` (None when unknown, e.g. CPU)."""
  for name, peak in PEAK_BF16:
    if name.lower() in device_kind.lower():
      return peak
  return None


def mfu(tokens_per_second: float, model: api.Model, seq_len: int,
        peak_per_device: float | None, num_devices: int) -> float | None:
  """Model FLOPs utilisation in [0, 1] (None without a known peak or FLOP count)."""
  per_token = flops_per_token(model, seq_len)
  if not peak_per_device or not per_token:
    return None
  return tokens_per_second * per_token / (peak_per_device * num_devices)
