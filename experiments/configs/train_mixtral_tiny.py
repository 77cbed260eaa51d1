r"""A tiny Mixtral-style sparse MoE (fp8jax.models.mixtral) on the embedded English corpus:
the study's pipeline on an MoE model that is not DeepSeek-MoE, its routing divergence and
per-expert metrics from the model's own router choices.

    python -m fp8jax.experiments.train --config=experiments/configs/train_mixtral_tiny.py \
        --workdir=out/mixtral
    python -m fp8jax.experiments.compare --train_workdir=out/mixtral --out=out/mixtral_cmp \
        --policies='bf16,gemm:nvfp4_recipe,gemm:mxfp8@layers/\d+/mlp/experts'

2 layers, hidden 64, grouped-query attention, 4 SwiGLU experts of width 128 with top-2
routing; the Llama's run (train_llama_tiny.py): 200 steps of 8 x 128 byte tokens with
checkpoints at 0, 50, 100, 150, 200, ``--config.model_overrides.swiglu_limit`` too. Its
policies are rules over its module paths (fp8jax.models.rules_policy: ``gemm:RECIPE[@REGEX]``,
``output:SPEC@REGEX``, ...; the experts' grouped GEMMs are ``layers/{i}/mlp/experts``).
"""

from fp8jax.experiments.configs import train_llama_tiny


def get_config():
  c = train_llama_tiny.get_config()  # the same data, schedule and checkpoints
  c.model = "mixtral:tiny"
  return c
