"""Where a first call's time goes: tracing, lowering and XLA compilation of the training
step, or of the paired evaluation (the BF16 gradient and the policy's, as ``compare`` runs
them), with and without the scan over layers (``scan_layers``), for each policy.

    python scripts/bench/compile_split.py --model=tiny --layers=8 --batch=8 --seq=128 \
        --policies=bf16,gemm:fp32_blockwise [--json=out.json]
    python scripts/bench/compile_split.py --target=pair --model=deepseek_moe_2b --layers=9 \
        --batch=8 --seq=2048 --moe-impl=pallas --policies=gemm:fp32_blockwise

``--target=pair`` records the BF16 gradient pass (``pair_bf16``, shared by every policy of a
sweep) and the policy's pass (``pair_<policy>``, without telemetry) apart; a recipe pair's
compile is their sum.

Each (policy, scan) is traced, lowered and compiled in this process with
``jax.jit(step).trace(...)``, ``.lower()``, ``.compile()`` (the persistent compilation cache
is off: the XLA figure is a cold compile). A warm persistent cache skips only the last
stage, so ``trace + lower`` is what a rerun still pays.
"""

import argparse
import json
import time

import _repo  # noqa: F401  (the checkout's models/ as fp8jax.models)
from _results import RESULTS, record
import jax
import optax

from fp8jax.models import config as config_lib
from fp8jax.models import deepseek_model, deepseek_moe
from fp8jax.models import policy as policy_lib
from fp8jax.study.comparison import paired
from fp8jax.train import mesh as mesh_lib
from fp8jax.train import step as step_lib


def _stages(fn, *args) -> dict:
  """Seconds to trace, lower and compile ``fn`` (jitted) at ``args`` (abstract)."""
  t0 = time.perf_counter()
  traced = fn.trace(*args)
  t1 = time.perf_counter()
  lowered = traced.lower()
  t2 = time.perf_counter()
  lowered.compile()
  t3 = time.perf_counter()
  return {"trace_s": t1 - t0, "lower_s": t2 - t1, "compile_s": t3 - t2,
          "hlo_chars": len(lowered.as_text())}


def pair(cfg, policy, batch: int, seq: int, scan: bool, moe_impl: str,
         bf16: bool = True) -> dict[str, dict]:
  """The stages of the paired evaluation's passes: ``{"bf16": ..., "policy": ...}``, the
  BF16 pass only with ``bf16`` (it is the same for every policy)."""
  mesh = mesh_lib.data_mesh()
  model = deepseek_model.model(cfg, deepseek_model.Options(scan=scan or None))
  ev = paired.PairedEvaluator(model, [policy], mesh, moe_impl, telemetry=False)
  params = deepseek_moe.abstract_params(cfg)
  tokens = jax.ShapeDtypeStruct((batch, seq), "int32")
  with jax.set_mesh(mesh):
    out = {"bf16": _stages(ev.baseline_jit, params, tokens)} if bf16 else {}
    base = ev.baseline_jit.trace(params, tokens).out_info  # the variant's abstract input
    out["policy"] = _stages(ev.variant_jits[policy.name], params, tokens, base,
                            ev.empty_state[policy.name])
  return out


def split(cfg, policy, batch: int, seq: int, scan: bool, moe_impl: str) -> dict:
  """Seconds to trace, lower and compile the training step (abstract inputs)."""
  tx = optax.adamw(1e-3)
  params = deepseek_moe.abstract_params(cfg)
  state = jax.eval_shape(lambda p: step_lib.init_state(p, tx), params)
  tokens = jax.ShapeDtypeStruct((batch, seq), "int32")
  model = deepseek_model.model(cfg, deepseek_model.Options(moe_impl, scan=scan or None))
  step = jax.jit(step_lib.make_train_step(model, tx, policy))
  return _stages(step, state, tokens)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", default="tiny")
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=128)
  ap.add_argument("--policies", default="bf16,gemm:fp32_blockwise")
  ap.add_argument("--moe-impl", default="dispatch")
  ap.add_argument("--target", default="train", choices=["train", "pair"])
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  jax.config.update("jax_enable_compilation_cache", False)
  cfg = config_lib.get_config(args.model, num_hidden_layers=args.layers)
  for expr in args.policies.split(","):
    policy = policy_lib.parse_policy(expr)
    for scan in (False, True):
      if args.target == "train":
        record(f"{expr} scan={scan}",
               **split(cfg, policy, args.batch, args.seq, scan, args.moe_impl))
        continue
      first = f"pair_bf16 scan={scan}" not in RESULTS
      got = pair(cfg, policy, args.batch, args.seq, scan, args.moe_impl, bf16=first)
      if first:
        record(f"pair_bf16 scan={scan}", **got["bf16"])
      record(f"pair_{expr} scan={scan}", **got["policy"])
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"args": vars(args), "device": jax.devices()[0].device_kind,
                 "jax": jax.__version__, "results": RESULTS}, f, indent=2)


if __name__ == "__main__":
  main()
