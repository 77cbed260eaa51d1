"""Run by tests/integration/test_multidevice.py in a fresh process with 4 simulated CPU devices:
``python tests/integration/multidevice_step.py train|sweep`` prints a JSON object.

The ``pallas`` sweep takes the MoE through the Pallas grouped GEMM (interpreted on CPU)
in a per-device ``shard_map``, as on GPUs (the trainer runs the same model code under the
same mesh context)."""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

from fp8jax.models import config as mc  # noqa: E402
from fp8jax.models import deepseek_model  # noqa: E402
from fp8jax.models import deepseek_moe as dm  # noqa: E402
from fp8jax.models import policy as policy_lib  # noqa: E402
from fp8jax.train import mesh as mesh_lib  # noqa: E402
from fp8jax.train import optim  # noqa: E402
from fp8jax.train import step as step_lib  # noqa: E402


def _model(cfg, scan=False):
  """DeepSeek-MoE of ``cfg``, its layers scanned with ``scan``."""
  return deepseek_model.model(cfg, deepseek_model.Options(scan=scan or None))


def losses(devices):
  cfg = mc.tiny(dtype="float32")
  tx = optim.optimizer(optim.OptimConfig(peak_lr=3e-3, warmup_steps=1, total_steps=20))
  mesh = mesh_lib.data_mesh(devices)
  step = mesh_lib.shard_step(step_lib.make_train_step(_model(cfg), tx), mesh)
  state = jax.device_put(step_lib.init_state(dm.init(cfg, jax.random.key(0)), tx),
                         mesh_lib.replicated(mesh))
  out = []
  for i in range(3):
    tokens = jax.random.randint(jax.random.key(10 + i), (8, 16), 0, cfg.vocab_size)
    tokens = jax.device_put(tokens, mesh_lib.batch_sharding(mesh))
    state, m = step(state, tokens)
    out.append([float(m["loss"]), float(m["grad_norm"])])
  return out, len(state.params["norm"]["weight"].sharding.device_set)


def per_layer_reduction() -> bool:
  """Whether the train step on the 4 devices, its layers scanned over params stored
  stacked, gives the same state and metrics bit for bit with each layer's gradients
  averaged in the backward pass (the default) as with the whole gradient averaged at the
  end."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  cfg = mc.tiny(dtype="float32")
  tx = optim.optimizer(optim.OptimConfig(peak_lr=3e-3, warmup_steps=1, total_steps=20))
  mesh = mesh_lib.data_mesh()
  state = jax.device_get(step_lib.seeded_init(_model(cfg), tx, policy_lib.BF16,
                                              stacked=True)(0))  # each step donates its own
  tokens = jax.random.randint(jax.random.key(3), (8, 16), 0, cfg.vocab_size)
  outs = []
  for per_layer in (True, False):
    step = mesh_lib.shard_step(step_lib.make_train_step(
        _model(cfg, scan=True), tx, mesh=mesh, reduce_per_layer=per_layer), mesh)
    outs.append(jax.device_get(step(jax.device_put(state, mesh_lib.replicated(mesh)),
                                    jax.device_put(tokens, mesh_lib.batch_sharding(mesh)))))
  return all(jax.tree.leaves(jax.tree.map(np.array_equal, *outs)))


def fsdp_split() -> dict:
  """The train step with the params split over the 4 devices (FSDP in per-device programs:
  ``make_train_step(param_specs=...)``) against the replicated state, for a model wide
  enough that ``fsdp_sharding`` splits its weights, the layers scanned over stacked params:
  losses, gradient norms and params after 2 steps, the split program's collectives and
  the per-device bytes of each program's arguments."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  from fp8jax.train import data_parallel as dp  # pylint: disable=import-outside-toplevel

  cfg = mc.tiny(hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                num_hidden_layers=4, dtype="float32")
  tx = optim.optimizer(optim.OptimConfig(peak_lr=3e-3, warmup_steps=1, total_steps=20))
  mesh = mesh_lib.data_mesh()
  init = step_lib.seeded_init(_model(cfg), tx, policy_lib.BF16, stacked=True)
  state0 = jax.device_get(init(0))
  split = mesh_lib.fsdp_sharding(jax.eval_shape(lambda: init(0)), mesh)
  specs = jax.tree.map(lambda sh: sh.spec, split.params)
  batches = [jax.device_put(jax.random.randint(jax.random.key(10 + i), (8, 32), 0,
                                               cfg.vocab_size), mesh_lib.batch_sharding(mesh))
             for i in range(2)]
  out = {}
  for name, param_specs, sharding in (("replicated", None, mesh_lib.replicated(mesh)),
                                      ("fsdp", specs, split)):
    step = mesh_lib.shard_step(step_lib.make_train_step(
        _model(cfg, scan=True), tx, mesh=mesh, param_specs=param_specs), mesh,
        None if param_specs is None else sharding)
    compiled = step.lower(jax.device_put(state0, sharding), batches[0]).compile()
    out[f"{name}_collectives"] = sorted(dp.collectives(compiled))
    out[f"{name}_argument_bytes"] = compiled.memory_analysis().argument_size_in_bytes
    state, rows = jax.device_put(state0, sharding), []
    for tokens in batches:
      state, m = step(state, tokens)
      rows.append([float(m["loss"]), float(m["grad_norm"])])
    out[f"{name}_rows"] = rows
    out[f"{name}_params"] = jax.device_get(state.params)
  diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))),
                       out.pop("replicated_params"), out.pop("fsdp_params"))
  out["fsdp_max_param_diff"] = max(jax.tree.leaves(diffs))
  return out


def fsdp_gather_in_bf16() -> dict:
  """FSDP with the split weights gathered in bfloat16 (``gather_dtype``) against gathered
  in float32, for a bfloat16-compute model (which casts every split weight to bfloat16
  before use): params after 2 steps, and the lowered all-gathers' element types."""
  import re  # pylint: disable=import-outside-toplevel

  import numpy as np  # pylint: disable=import-outside-toplevel

  cfg = mc.tiny(hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                num_hidden_layers=2, dtype="bfloat16")
  tx = optim.optimizer(optim.OptimConfig(peak_lr=3e-3, warmup_steps=1, total_steps=20))
  mesh = mesh_lib.data_mesh()
  init = step_lib.seeded_init(_model(cfg), tx, policy_lib.BF16, stacked=True)
  split = mesh_lib.fsdp_sharding(jax.eval_shape(lambda: init(0)), mesh)
  specs = jax.tree.map(lambda sh: sh.spec, split.params)
  tokens = jax.device_put(jax.random.randint(jax.random.key(3), (8, 32), 0, cfg.vocab_size),
                          mesh_lib.batch_sharding(mesh))
  out, params = {}, {}
  for name, dtype in (("f32", None), ("bf16", "bfloat16")):
    step = mesh_lib.shard_step(step_lib.make_train_step(
        _model(cfg, scan=True), tx, mesh=mesh, param_specs=specs, gather_dtype=dtype),
        mesh,
        split)
    state = jax.device_put(jax.device_get(init(0)), split)
    # The program as lowered (XLA:CPU then gathers bfloat16 as float32, the same values;
    # GPUs' NCCL gathers bfloat16).
    text = step.lower(state, tokens).as_text()
    out[f"gather_{name}_types"] = sorted(set(re.findall(
        r"stablehlo\.all_gather.*-> tensor<[0-9x]*x(\w+)>", text)))
    for _ in range(2):
      state, _ = step(state, tokens)
    params[name] = jax.device_get(state.params)
  same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), params["f32"], params["bf16"])
  out["gather_bf16_params_equal"] = all(jax.tree.leaves(same))
  return out


def _config():
  from fp8jax.train import run_config  # pylint: disable=import-outside-toplevel

  c = run_config.defaults()
  c.data.seq_len, c.data.global_batch = 32, 8
  c.model_overrides.dtype = "float32"
  c.optim.peak_lr, c.optim.warmup_steps = 3e-3, 1
  c.train.steps, c.train.save_every, c.train.log_every = 3, 3, 1
  return c


def run_loops(tmp, names=("one", "one4", "four", "fsdp")):
  """The training loop on 1 device, 4 replicas on 1 device, 4 devices, and 4 with FSDP
  (its layers scanned, stored stacked): ``{train_<name>: [[loss, grad norm]...]}``."""
  from fp8jax.train import loop, metrics_log  # pylint: disable=import-outside-toplevel

  c, out = _config(), {}
  for name, devices, fsdp, replicas in (("one", jax.devices()[:1], False, 0),
                                        ("one4", jax.devices()[:1], False, 4),
                                        ("four", None, False, 0), ("fsdp", None, True, 0)):
    if name not in names:
      continue
    # FSDP with the layers stored stacked: the run axis is never split
    c.train.fsdp, c.train.replicas, c.train.scan_layers = fsdp, replicas, fsdp
    loop.train(c, f"{tmp}/{name}", devices=devices)
    rows = metrics_log.read_rows(f"{tmp}/{name}/metrics.jsonl")
    out[f"train_{name}"] = [[r["loss"], r["grad_norm"]] for r in rows]
  return out


def run_sweeps(tmp):
  """The comparison sweep of the one-device run's checkpoint, 4 replicas each time
  (per-tensor amaxes are per replica): vmapped on one device, one per device on four (XLA
  MoE and Pallas MoE), and two per device on two."""
  from fp8jax.study.comparison import sweep  # pylint: disable=import-outside-toplevel

  out = {}
  windows = sweep.Windows(batches=1, batch_size=8)
  for name, devices, impl in (("one", jax.devices()[:1], "dispatch"),
                              ("four", None, "dispatch"), ("pallas", None, "pallas"),
                              ("two", jax.devices()[:2], "dispatch")):
    sweep.run(f"{tmp}/one", f"{tmp}/cmp_{name}", policies=["attn@0-2:e4m3"], steps=[3],
              windows=windows, devices=devices, moe_impl=impl, replicas=4, floor=False)
    row = json.loads(open(f"{tmp}/cmp_{name}/rows.jsonl").readline())
    out[f"sweep_{name}"] = [row["loss_fp8"], row["diff_norm"], row["norm_bf16"]]
  return out


def run_part(part: str) -> dict:
  """``train``: the train step and the loops; ``sweep``: the sweeps (after a one-device
  run to compare)."""
  import tempfile  # pylint: disable=import-outside-toplevel

  from fp8jax.train import loop  # pylint: disable=import-outside-toplevel

  with tempfile.TemporaryDirectory() as tmp:
    if part == "sweep":
      run_loops(tmp, names=("one",))
      return run_sweeps(tmp)
    one, _ = losses(jax.devices()[:1])
    four, n = losses(jax.devices())
    out = {"one": one, "four": four, "devices": n, **run_loops(tmp),
           "per_layer_equal": per_layer_reduction(), **fsdp_split(), **fsdp_gather_in_bf16()}
    try:
      mesh_lib.check_global_batch(6, mesh_lib.data_mesh())
    except ValueError as e:
      out["error"] = str(e)
    c = _config()
    c.data.global_batch = 6
    try:
      loop.train(c, f"{tmp}/bad")
    except ValueError as e:
      out["loop_error"] = str(e)
    return out


if __name__ == "__main__":
  assert len(jax.devices()) == 4, jax.devices()
  json.dump(run_part(sys.argv[1]), sys.stdout)
