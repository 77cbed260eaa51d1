"""Library modules whose tests live in another module's test file, and that file.

``tests/project/test_tests_mirror.py`` requires every library module either to have its
mirrored test module (``fp8jax/gemm/dense.py`` -> ``tests/gemm/test_dense.py``,
``models/llama.py`` -> ``tests/models/test_llama.py``) or an entry here. An entry names the
test file that exercises the module (through its package's API, or a binary's run); when
the mirrored test module is written, the entry is removed (the test fails on a stale one).
The entries left are the absl binaries of ``experiments/``: short mains over library
functions, run as subprocesses by the integration and data tests named here.
"""

COVERED_BY = {
    "fp8jax.experiments._cli": "tests/integration/test_flag_fuzz.py",
    "fp8jax.experiments.branch": "tests/integration/test_cli_errors.py",
    "fp8jax.experiments.compare": "tests/integration/test_cli_errors.py",
    "fp8jax.experiments.compare_runs": "tests/integration/test_cli_errors.py",
    "fp8jax.experiments.convert_hf": "tests/models/test_hf_convert.py",
    "fp8jax.experiments.formats": "tests/integration/test_cli_errors.py",
    "fp8jax.experiments.prepare_data": "tests/data/test_prepare.py",
    "fp8jax.experiments.report": "tests/integration/test_cli_errors.py",
    "fp8jax.experiments.study": "tests/integration/test_multihost.py",
    "fp8jax.experiments.train": "tests/data/test_bpe.py",
    "fp8jax.experiments.train_tokenizer": "tests/data/test_bpe.py",
    "fp8jax.experiments.validate": "tests/study/runs/test_validation.py",
    "fp8jax.experiments.verify": "tests/data/test_prepare.py",
}
