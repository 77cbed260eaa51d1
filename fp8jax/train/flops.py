"""Model FLOPs and model FLOPs utilisation (MFU) of DeepSeek-MoE training.

Model FLOPs per token (forward + backward = 3 x forward, as in PaLM's MFU):

    6 * N_matmul + 12 * L * d * S

``N_matmul`` counts the weights every token multiplies: attention projections, the
router, the shared experts, ``num_experts_per_tok`` routed experts (unpadded width), the
dense MLPs and the head; not the embedding (a lookup) nor the norms. ``12 L d S`` is
the attention core (QK^T and AV, causal masking not discounted). Padding, recomputation
and the simulated-FP8 arithmetic are not model FLOPs, so they lower MFU.
"""

from __future__ import annotations

from fp8jax.models.config import ModelConfig, param_counts

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, by device kind.
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12),
             ("B200", 2250e12), ("A100", 312e12), ("L40S", 362e12), ("A10G", 70e12))


def matmul_params(cfg: ModelConfig) -> int:
  """Weights multiplied per token (activated params minus embedding and norms)."""
  norms = cfg.hidden_size * (2 * cfg.num_hidden_layers + 1)
  return param_counts(cfg)["activated"] - cfg.vocab_size * cfg.hidden_size - norms


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Training model FLOPs per token at sequence length ``seq_len``."""
  attention = 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len
  return 6.0 * matmul_params(cfg) + attention


def peak_flops(device_kind: str) -> float | None:
  """The dense bf16 peak of one device of ``device_kind`` (None when unknown, e.g. CPU)."""
  for name, peak in PEAK_BF16:
    if name.lower() in device_kind.lower():
      return peak
  return None


def mfu(tokens_per_second: float, cfg: ModelConfig, seq_len: int,
        peak_per_device: float | None, num_devices: int) -> float | None:
  """Model FLOPs utilisation in [0, 1] (None without a known peak)."""
  if not peak_per_device:
    return None
  return tokens_per_second * flops_per_token(cfg, seq_len) / (peak_per_device * num_devices)
