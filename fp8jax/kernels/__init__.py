"""Hand-written kernels (Pallas). Import the modules directly; nothing is imported here."""
