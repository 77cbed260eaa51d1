"""Run configs for the experiment binaries; each file documents its exact command."""
