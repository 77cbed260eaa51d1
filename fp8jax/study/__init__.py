"""The precision comparison study: paired BF16/FP8 gradients over checkpoints (sweep) and its
report."""
