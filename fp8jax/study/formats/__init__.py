"""The numerics study of the formats themselves, on synthetic tensors and the tiny model:
the FP8 sections (:mod:`~fp8jax.study.formats.fp8_sections`, with
:mod:`~fp8jax.study.formats.model_site`), the MX / NVFP4 sections
(:mod:`~fp8jax.study.formats.mx_sections`, :mod:`~fp8jax.study.formats.mx_writeup`)
and the report (:mod:`~fp8jax.study.formats.writeup`: JSON, figures, ``report.md``).

Import the modules directly; nothing is imported here.
"""
