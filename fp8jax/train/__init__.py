"""Training: optimizer and schedule, the jitted train step, non-finite detection."""
