"""Model FLOPs utilisation (fp8jax/train/flops.py): the peak of a device kind and MFU, against
hand-computed values."""

import pytest

from fp8jax.models import registry
from fp8jax.train import flops


class _Counted:
  """A model that counts ``per_token`` FLOPs per token at any sequence length."""

  def __init__(self, per_token):
    self.per_token = per_token

  def flops_per_token(self, seq_len):
    del seq_len
    return self.per_token


@pytest.mark.parametrize("kind, peak", [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H200", 989e12), ("NVIDIA A100-SXM4-40GB", 312e12), ("nvidia l40s", 362e12),
    ("cpu", None), ("TPU v5 lite", None)])
def test_peak_flops_by_device_kind(kind, peak):
  assert flops.peak_flops(kind) == peak


def test_mfu_is_model_flops_over_the_peak_of_all_devices():
  # 2000 tokens/s x 3e9 FLOPs/token over 2 devices of 1e13 FLOP/s each = 6e12 / 2e13.
  assert flops.mfu(2000.0, _Counted(3e9), 128, 1e13, 2) == pytest.approx(0.3)
  assert flops.mfu(2000.0, _Counted(3e9), 128, None, 2) is None  # unknown peak (CPU)
  assert flops.mfu(2000.0, _Counted(0.0), 128, 1e13, 2) is None  # the model does not say


def test_flops_per_token_are_the_models_own():
  # DeepSeek-MoE tiny (d 64, 3 layers, layer 0 dense of width 96, layers 1-2 MoE: router 64x8, one
  # shared and 2 of 8 routed experts of width 32, head 64x320), by hand: attention
  # 3 x 4 x 64x64 = 49152, dense MLP 3 x 64x96 = 18432, per MoE layer 512 + 3 x 3 x 64x32
  # = 18944, head 20480 -> 125952 weights; 6 x 125952 + 12 x 3 x 64 x 64 (seq 64).
  tiny = registry.get("deepseek_moe:tiny")
  assert flops.flops_per_token(tiny, 64) == 6 * 125952 + 12 * 3 * 64 * 64
  assert flops.flops_per_token(_Counted(7), 64) == 7.0
  with pytest.raises(AttributeError):  # a model config is not a model
    flops.flops_per_token(tiny.config, 64)
