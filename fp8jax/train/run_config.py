"""The training run's configuration: defaults, and validation before any compute.

A run config is an ``ml_collections.ConfigDict`` with exactly the keys of
:func:`defaults` (config files in ``experiments/configs/`` start from it). Validation
names the offending key: an unknown key, an unknown model, dataset, policy or tokenizer,
a missing ``data_dir``, a tokenizer vocabulary larger than the model's, a bad
``precision`` option, or a batch that does not split over the devices.

The ``precision`` group (training-precision options, see :func:`defaults`):

* ``moments``: AdamW's two moments in "float32" or "bfloat16" (as DeepSeek-V3);
  ``master_weights``: params stored in "float32" or "bfloat16" (the update is computed in
  float32 and ``p + update`` rounded to BF16, to nearest even). See :mod:`fp8jax.train.optim`.
* ``loss_scale``: "none" or "dynamic" (the FP16 baseline, with
  ``model_overrides.dtype="float16"``): ``loss_scale_init``, ``loss_scale_growth_interval``,
  ``loss_scale_min``, factor 2; non-finite steps are skipped and counted instead of
  stopping the run. See :mod:`fp8jax.train.loss_scale`.
* ``fp8_param_gather``: the forward uses the weights after a simulated FP8 (E4M3,
  128 x 128 blocks) FSDP gather. See :mod:`fp8jax.train.param_gather`.
* ``check_update``: a step is refused when its update would make a parameter non-finite,
  not only when what it reads is non-finite. See :mod:`fp8jax.train.step`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import ml_collections

from fp8jax.models import api, layer_scan, registry
from fp8jax.train import evaluation, full_state, optim
from fp8jax.train import loss_scale as loss_scale_lib

RESUME_MAY_CHANGE = ("data.skip_bad_records", "train.save_every", "train.log_every",
                     "train.tensorboard", "train.peak_tflops", "train.noise_probe_every",
                     "train.full_state", "train.full_state_steps",
                     "train.checkpoint_params_dtype", "precision.check_update")
"""Keys a ``--resume`` may change freely: they change neither a step's computation nor the
data the run has read (``skip_bad_records``: a run that stopped at a bad record read none,
and the records it skipped stay skipped). ``train.steps`` may change too, if the LR
schedule does not follow it (``optim.total_steps`` set), and ``policy`` with
``--allow_policy_change`` (docs/reliability.md: What may change on resume)."""
FLOAT_DTYPES = ("float32", "bfloat16")
LOSS_SCALES = ("none", "dynamic")


def defaults() -> ml_collections.ConfigDict:
  """Every key a run config may set, with its default."""
  c = ml_collections.ConfigDict()
  c.model = "tiny"                      # fp8jax.models.registry name: "llama:tiny",
                                        # "deepseek_moe:2b", or a DeepSeek-MoE config name
  c.model_overrides = ml_collections.ConfigDict()  # the model config's fields, e.g. dtype
  c.policy = "bf16"                     # the model's policy text (DeepSeek-MoE:
                                        # fp8jax.models.policy.parse_policy; models by
                                        # rules: fp8jax.models.rules_policy)
  c.seed = 0                            # parameter init
  c.data = ml_collections.ConfigDict(dict(
      source="embedded",                # "embedded", "files", "prepared" or "tfds:<name>"
      paths=(),                         # for "files": shard files, folders or globs
      field="text",                     # JSON / Parquet / tfds text field
      data_dir="",                      # tfds data_dir ("" = tfds default); "prepared": folder
      skip_bad_records=False,           # "files": skip (and count) bad records, not fail
      split="train",
      tokenizer="bytes",                # "bytes" or a tokenizer.json path
      seq_len=128,
      global_batch=8,                   # sequences per step over all devices
      seed=0))                          # shuffle seed
  c.optim = ml_collections.ConfigDict(dataclasses.asdict(optim.OptimConfig()))
  c.optim.total_steps = 0               # 0: train.steps
  c.precision = ml_collections.ConfigDict(dict(
      moments="float32",                # AdamW moments: "float32" or "bfloat16" (DeepSeek-V3)
      master_weights="float32",         # params: "float32" or "bfloat16" (update in float32,
                                        # rounded to nearest even)
      loss_scale="none",                # "dynamic": FP16 baseline (model_overrides.dtype=
                                        # "float16"); non-finite steps skipped, not fatal
      loss_scale_init=2.0**15,          # initial loss scale
      loss_scale_growth_interval=2000,  # doubles after this many consecutive finite steps
      loss_scale_min=1.0,               # halving below it stops the run (NonFiniteError)
      fp8_param_gather=False,           # forward on E4M3 128x128-block weights (simulated
                                        # FSDP FP8 gather, straight-through); logs memory
      check_update=False))              # True: a step whose update would make a param
                                        # non-finite is refused before it is applied (one
                                        # more pass over the params); False: found by the
                                        # next step or before a save (fp8jax.train.step)
  c.train = ml_collections.ConfigDict(dict(
      steps=100,                        # updates to run
      save_every=50,                    # checkpoint at 0, every N steps and at the end
      log_every=10,
      fsdp=False,                       # shard params and optimizer state on "data"
      replicas=0,                       # data-parallel replicas, each the gradients of its
                                        # own rows (0: one per device; a multiple of the
                                        # devices: fp8jax.train.data_parallel); not with fsdp
      moe_impl="dispatch",
      tensorboard=False,
      checkpoints=True,                 # False: no checkpoint at all (speed runs); such a
                                        # run cannot be resumed
      full_state="all",                 # "last": only the newest checkpoint (and those at
                                        # full_state_steps) keeps the optimizer state, the
                                        # others the params only (fp8jax.train.full_state)
      full_state_steps=(),              # steps whose checkpoints keep it ("last" only)
      checkpoint_params_dtype="",       # "bfloat16": checkpoints store the params in BF16,
                                        # the newest the exact ones too ("last" only)
      noise_probe_every=0,              # N > 0: every N-th step also logs the BF16 gradient's
                                        # norm against the quantization noise's (a multiple
                                        # of log_every; fp8jax.train.noise_probe)
      scan_layers=False,                # alike consecutive layers as one lax.scan,
                                        # unrolled, their params stored stacked: traced
                                        # once, compiled in a fraction of the loop's time
                                        # (fp8jax.models.layer_scan; docs/performance.md)
      fsdp_gather_dtype="",             # with fsdp: the split weights cast to this dtype
                                        # before their gather ("bfloat16": half the bytes;
                                        # the same values when it is the model's compute
                                        # dtype), "" to gather them as stored
      scan_unroll=0,                    # with scan_layers: layers per loop iteration (0:
                                        # all; 1: rolled, one layer's gathered weights at a
                                        # time under fsdp)
      scan_remat="",                    # with scan_layers: a jax.checkpoint_policies name
                                        # (what a layer keeps for its backward pass; the
                                        # rest is recomputed), "" for everything
      deterministic=False,              # GPU: bit-identical reruns (XLA's deterministic
                                        # ops; fp8jax.train.determinism), at a cost in speed
      eval_precision="",                # "train" or "bf16": every logged step also logs its
                                        # batch's loss at the params before the update, a
                                        # forward in the run's policy or in the model's BF16
                                        # baseline (eval/loss, eval/lm_loss; "": none), which
                                        # validate compares (fp8jax.train.evaluation)
      peak_tflops=0.0))                 # per-device bf16 peak for MFU (0: by device kind)
  return c


def _unknown_keys(cfg, ref, prefix="") -> list[str]:
  out = []
  for key in cfg.keys():
    if key not in ref:
      out.append(prefix + key)
    elif isinstance(ref[key], ml_collections.ConfigDict) and key != "model_overrides":
      if not isinstance(cfg[key], ml_collections.ConfigDict | dict):
        out.append(f"{prefix}{key} (expected a group)")
      else:
        out.extend(_unknown_keys(cfg[key], ref[key], f"{prefix}{key}."))
  return out


def with_defaults(saved: dict, ref: dict | None = None) -> dict:
  """``saved`` (a config as a dict) with the keys it lacks (added to :func:`defaults`
  after it was written) filled in from ``ref`` (default: the defaults)."""
  ref = json.loads(defaults().to_json()) if ref is None else ref
  out = dict(saved)
  for key, value in ref.items():
    if key not in out:
      out[key] = value
    elif isinstance(value, dict) and isinstance(out[key], dict):
      out[key] = with_defaults(out[key], value)
  return out


def load_saved(workdir, flag: str = "--workdir") -> ml_collections.ConfigDict:
  """The config a training run saved in ``workdir/config.json`` (keys added since it was
  written take their defaults).

  Raises:
    FileNotFoundError: ``workdir`` is not a training run's folder (the message names
      ``flag``, the binary's flag that gave the folder).
  """
  path = pathlib.Path(workdir) / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{path} not found: {flag} must be a training run's folder "
                            "(python -m fp8jax.experiments.train)")
  return ml_collections.ConfigDict(with_defaults(read_saved(path)))


def read_saved(path) -> dict:
  """The config dict a run saved in ``path`` (its ``config.json``).

  Raises:
    ValueError: the file is not a JSON object; the message names the file and line.
  """
  path = pathlib.Path(path)
  try:
    saved = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno}); "
                     "every checkpoint's meta item holds the run's config (key 'config') "
                     "to restore it from") from None
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not text (byte {e.start}: {e.reason})") from None
  if not isinstance(saved, dict):
    raise ValueError(f"{path}:1: not a run config (a JSON {type(saved).__name__}, not an "
                     "object)")
  return saved


def model(cfg, *, moe_impl: str | None = None, deterministic: bool | None = None,
          scan=None) -> api.Model:
  """The run's model (:func:`fp8jax.models.registry.get` of ``cfg.model`` with
  ``cfg.model_overrides``), computing as the ``train`` group says, or as the keywords
  given say (a command that evaluates the run's checkpoints its own way): DeepSeek-MoE's
  ``moe_impl``, ``deterministic`` and layer ``scan`` (options, or True; False: the loop).
  A model without such options refuses them when they are not at their defaults."""
  t, options = cfg.train, {}
  moe_impl = t.moe_impl if moe_impl is None else moe_impl
  deterministic = t.deterministic if deterministic is None else deterministic
  scan = scan_options(cfg) if scan is None else scan
  if moe_impl != "dispatch":
    options["moe_impl"] = moe_impl
  if deterministic:
    options["deterministic"] = True
  if scan:
    options["scan"] = scan
  return registry.get(cfg.model, dict(cfg.model_overrides), options)


def optim_config(cfg) -> optim.OptimConfig:
  values = dict(cfg.optim)
  values["total_steps"] = values["total_steps"] or cfg.train.steps
  values["decay_at"] = tuple(values["decay_at"])
  return optim.OptimConfig(**values)


def scan_options(cfg) -> layer_scan.ScanOptions | None:
  """How the run scans its layers (``train.scan_layers``, ``scan_unroll``,
  ``scan_remat``), or None for the layer loop."""
  t = cfg.train
  if not t.scan_layers:
    if t.get("scan_unroll", 0) or t.get("scan_remat", ""):
      raise ValueError(f"train.scan_unroll={t.scan_unroll!r} and train.scan_remat="
                       f"{t.scan_remat!r} need train.scan_layers=True")
    return None
  return layer_scan.ScanOptions(int(t.get("scan_unroll", 0)), t.get("scan_remat", "") or None)


def loss_scale_config(cfg) -> loss_scale_lib.DynamicLossScale | None:
  """The run's dynamic loss scaling, or None (``precision.loss_scale="none"``)."""
  p = cfg.precision
  if p.loss_scale == "none":
    return None
  return loss_scale_lib.DynamicLossScale(
      init=float(p.loss_scale_init), growth_interval=p.loss_scale_growth_interval,
      minimum=float(p.loss_scale_min))


def _check_precision(p) -> None:
  for key in ("moments", "master_weights"):
    if p[key] not in FLOAT_DTYPES:
      raise ValueError(f"precision.{key} must be one of {FLOAT_DTYPES}, got {p[key]!r}")
  if p.loss_scale not in LOSS_SCALES:
    raise ValueError(f"precision.loss_scale must be one of {LOSS_SCALES}, got "
                     f"{p.loss_scale!r}")
  for key in ("fp8_param_gather", "check_update"):
    if not isinstance(p[key], bool):
      raise ValueError(f"precision.{key} must be a bool, got {p[key]!r}")
  interval = p.loss_scale_growth_interval
  if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
    raise ValueError(f"precision.loss_scale_growth_interval must be an integer >= 1, got "
                     f"{interval!r}")
  lo, init = float(p.loss_scale_min), float(p.loss_scale_init)
  if not 0 < lo < float("inf"):
    raise ValueError(f"precision.loss_scale_min must be a finite number > 0, got {lo}")
  if not lo <= init < float("inf"):
    raise ValueError(f"precision.loss_scale_init must be finite and >= "
                     f"precision.loss_scale_min {lo}, got {init}")


def _check_full_state(t) -> None:
  if t.full_state not in full_state.MODES:
    raise ValueError(f"train.full_state must be one of {full_state.MODES}, got "
                     f"{t.full_state!r}")
  steps = t.full_state_steps
  if isinstance(steps, str | int) or not all(
      isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps):
    raise ValueError(f"train.full_state_steps must be a tuple of steps (integers >= 0), got "
                     f"{steps!r}")
  if t.checkpoint_params_dtype not in full_state.PARAMS_DTYPES:
    raise ValueError(f"train.checkpoint_params_dtype must be one of "
                     f"{full_state.PARAMS_DTYPES}, got {t.checkpoint_params_dtype!r}")
  for key, value in (("full_state_steps", tuple(steps)),
                     ("checkpoint_params_dtype", t.checkpoint_params_dtype)):
    if value and t.full_state != "last":
      raise ValueError(f"train.{key}={value!r} needs train.full_state='last' (with 'all' "
                       "every checkpoint keeps its full state, in the params' own dtype)")


def check(cfg) -> tuple[api.Model, object]:
  """Checks everything that needs no data or devices; returns (model, policy)."""
  bad = _unknown_keys(cfg, defaults())
  if bad:
    raise ValueError(f"unknown config keys {bad}; see fp8jax.train.run_config.defaults()")
  t = cfg.train
  for key in ("steps", "save_every", "log_every"):  # before the schedule's checks
    if int(t[key]) < 1:
      raise ValueError(f"train.{key} must be >= 1, got {t[key]}")
  for key, least in (("global_batch", 1), ("seq_len", 2)):
    if int(cfg.data[key]) < least:
      raise ValueError(f"data.{key} must be >= {least}, got {cfg.data[key]}")
  the_model = model(cfg)  # also checks the scan options
  policy = the_model.policy(cfg.policy)
  optim_config(cfg)
  _check_precision(cfg.precision)
  probe = int(t.noise_probe_every)
  if probe < 0 or (probe and probe % int(t.log_every)):
    raise ValueError(f"train.noise_probe_every must be 0 (off) or a positive multiple of "
                     f"train.log_every {t.log_every}, got {t.noise_probe_every}")
  if not isinstance(t.checkpoints, bool):
    raise ValueError(f"train.checkpoints must be a bool, got {t.checkpoints!r}")
  if t.get("eval_precision", "") not in evaluation.PRECISIONS:
    raise ValueError(f"train.eval_precision must be one of {evaluation.PRECISIONS} ('': no "
                     f"evaluation forward), got {t.eval_precision!r}")
  _check_full_state(t)
  gather = t.get("fsdp_gather_dtype", "")
  if gather and (gather not in FLOAT_DTYPES or not t.fsdp or cfg.precision.fp8_param_gather):
    raise ValueError(f"train.fsdp_gather_dtype must be '' or one of {FLOAT_DTYPES}, with "
                     f"train.fsdp=True and without precision.fp8_param_gather; got {gather!r}")
  replicas = int(t.get("replicas", 0))
  if replicas < 0 or (replicas and int(cfg.data.global_batch) % replicas):
    raise ValueError(f"train.replicas must be 0 (one per device) or a positive divisor of "
                     f"data.global_batch {cfg.data.global_batch}, got {t.replicas}")
  if replicas and t.fsdp:
    raise ValueError("train.replicas needs the replicated state; with train.fsdp each "
                     "device is one replica: leave train.replicas at 0")
  if the_model.max_len and cfg.data.seq_len > the_model.max_len:
    raise ValueError(f"data.seq_len {cfg.data.seq_len} exceeds the model's "
                     f"max_position_embeddings {the_model.max_len}")
  return the_model, policy
