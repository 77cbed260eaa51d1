"""Hypothesis strategies for tensors and specs."""

from __future__ import annotations

import os

from hypothesis import strategies as st
import ml_dtypes
import numpy as np

import fp8jax

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
FORMATS = ["e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz"]


def examples(fast: int, full: int) -> int:
  """Examples for a property test whose every example compiles or runs long: ``fast`` in
  the suite's derandomized default profile, ``full`` in the ``explore`` pass that CI runs
  after it (fresh examples) and in ``thorough`` (``tests/conftest.py``)."""
  return fast if os.environ.get("FP8JAX_HYPOTHESIS", "default") == "default" else full


@st.composite
def shapes(draw, min_rank=1, max_rank=3, max_elements=6000):
  """Shapes whose sizes sit around tile boundaries (31/32/33, 127/128/129, ...)."""
  rank = draw(st.integers(min_rank, max_rank))
  sizes = [1, 2, 3, 31, 32, 33, 127, 128, 129, 200, 300]
  dims = draw(st.lists(st.sampled_from(sizes), min_size=rank, max_size=rank))
  while int(np.prod(dims)) > max_elements:
    i = int(np.argmax(dims))
    dims[i] = dims[i] // 4 + 1
  return tuple(dims)


@st.composite
def granularities(draw, rank):
  kinds = ["tensor", "axis", "tile"] + (["block"] if rank >= 2 else [])
  kind = draw(st.sampled_from(kinds))
  axis = st.integers(-rank, rank - 1)
  size = st.sampled_from([1, 2, 7, 32, 128])
  if kind == "tensor":
    return fp8jax.per_tensor()
  if kind == "axis":
    return fp8jax.per_axis(draw(axis))
  if kind == "tile":
    return fp8jax.tile(draw(size), draw(axis))
  a0 = draw(axis)
  a1 = draw(axis.filter(lambda a: a % rank != a0 % rank))
  return fp8jax.block((draw(size), draw(size)), (a0, a1))


@st.composite
def specs(draw, rank, formats=tuple(FORMATS)):
  scale_format = draw(st.sampled_from(["fp32", "pow2"]))
  return fp8jax.QuantSpec(
      format=draw(st.sampled_from(formats)),
      granularity=draw(granularities(rank)),
      scale_format=scale_format,
      pow2_rounding=draw(st.sampled_from(["floor", "ceil", "rceil"]))
      if scale_format == "pow2" else None,
      store_e8m0=scale_format == "pow2" and draw(st.booleans()),
      eps=draw(st.sampled_from([0.0, 1e-12, 1e-4])),
      margin=draw(st.integers(-2, 3)),
  )


@st.composite
def arrays(draw, shape, dtype_name=None, allow_nonfinite=True):
  """Arrays mixing magnitudes, exact zeros, zero runs, subnormals and non-finites."""
  dtype_name = dtype_name or draw(st.sampled_from(sorted(DTYPES)))
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  n = int(np.prod(shape))
  log_lo, log_hi = {"float32": (-44, 38), "bfloat16": (-40, 38), "float16": (-7, 4)}[dtype_name]
  center = draw(st.integers(log_lo + 4, log_hi - 4))
  spread = draw(st.sampled_from([0, 1, 3, 8]))
  mags = 10.0 ** np.clip(center + spread * rng.standard_normal(n), log_lo, log_hi)
  x = (rng.choice([-1.0, 1.0], n) * mags).astype(np.float64)
  if draw(st.booleans()):
    x[rng.random(n) < 0.2] = 0.0
  if draw(st.booleans()):  # a run of zeros, often covering whole tiles
    start = rng.integers(0, n)
    x[start:start + rng.integers(1, 300)] = 0.0
  if allow_nonfinite and draw(st.booleans()):
    k = rng.integers(1, 4)
    x[rng.integers(0, n, k)] = rng.choice([np.nan, np.inf, -np.inf], k)
  with np.errstate(over="ignore"):
    return x.astype(DTYPES[dtype_name]).reshape(shape)


@st.composite
def arrays_and_specs(draw):
  """(an array of a drawn shape, a spec drawn for its rank)."""
  shape = draw(shapes())
  return draw(arrays(shape)), draw(specs(len(shape)))


def _expressible_specs() -> list:
  """Every site spec the policy grammar writes: the presets and FORMAT/GRANULARITY with
  current or delayed (per-tensor) scaling."""
  from fp8jax.models import policy as policy_lib
  out = list(fp8jax.numerics.presets.PRESETS.values())
  for fmt in fp8jax.numerics.formats.FORMATS:
    for make in policy_lib.GRANULARITIES.values():
      out.append(fp8jax.QuantSpec(format=fmt, granularity=make()))
    for h, reduce, margin in ((1024, "max", 0), (16, "most_recent", 2), (1, "max", -3)):
      out.append(fp8jax.QuantSpec(format=fmt, granularity=fp8jax.per_tensor(),
                                  scaling="delayed", history_len=h, history_reduce=reduce,
                                  margin=margin))
  return out


@st.composite
def policies(draw, max_layer=11):
  """Precision policies the expression grammar can write: site rules (any site, layer set
  and expressible spec), an optional named GEMM recipe on all or some layers with its BF16
  tail, optionally as a noise-matched control; named by an arbitrary label."""
  from fp8jax.gemm import recipes
  from fp8jax.models import policy as policy_lib
  layer_sets = st.none() | st.lists(st.integers(0, max_layer), min_size=1, max_size=6,
                                    unique=True).map(lambda v: tuple(sorted(v)))
  rules = draw(st.lists(st.builds(policy_lib.SiteRule, st.sampled_from(policy_lib.SITES),
                                  layer_sets, st.sampled_from(_expressible_specs())),
                        max_size=4))
  gemm_name = draw(st.none() | st.sampled_from(sorted(recipes.RECIPES)))
  gemm, gemm_layers, tail = None, None, 0.0
  if gemm_name is not None:
    gemm, gemm_layers = recipes.RECIPES[gemm_name], draw(layer_sets)
    tail = recipes.BF16_TAIL.get(gemm_name, 0.0)
  pol = policy_lib.PrecisionPolicy(tuple(rules), draw(st.sampled_from(["p", "x_l0"])), gemm,
                                   gemm_layers, tail)
  if (rules or gemm is not None) and draw(st.booleans()):
    pol = policy_lib.noise_policy(pol)
  return pol
