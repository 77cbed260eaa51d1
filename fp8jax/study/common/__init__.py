"""Results I/O and statistics shared by the studies (the bottom room of :mod:`fp8jax.study`).

Import the modules directly; nothing is imported here.
"""
