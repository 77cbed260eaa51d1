"""The numerics study of the formats themselves, on synthetic tensors and the tiny model:
the FP8 sections (:mod:`~fp8jax.study.numerics.fp8_study`, with
:mod:`~fp8jax.study.numerics.model_site`), the MX / NVFP4 sections
(:mod:`~fp8jax.study.numerics.formats_study`, :mod:`~fp8jax.study.numerics.formats_report`)
and the report (:mod:`~fp8jax.study.numerics.report`: JSON, figures, ``report.md``).

Import the modules directly; nothing is imported here.
"""
