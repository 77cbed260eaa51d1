"""Checks that a workdir may take a training run: refuses to overwrite a run, to resume one
that saved no checkpoint, or to resume under another config or precision policy.

    has_run = check(workdir, cfg, resume, policy, allow_policy_change, stream)

What may change on resume is :data:`fp8jax.train.run_config.RESUME_MAY_CHANGE` (docs/reliability.md:
What may change on resume); each change is printed.
"""

from __future__ import annotations

import json
import pathlib
import sys

from fp8jax.train import checkpoint as ckpt_lib
from fp8jax.train import metrics_log, run_config

PolicyMismatchError = ckpt_lib.PolicyMismatchError


def _config_changes(old: dict, new: dict, prefix: str = "") -> list[str]:
  """Dotted keys whose values differ between two config dicts."""
  out = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key), new.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      out.extend(_config_changes(a, b, f"{prefix}{key}."))
    elif a != b:
      out.append(prefix + key)
  return out


def check(workdir: pathlib.Path, cfg, resume: bool, policy,
          allow_policy_change: bool = False, stream=None, *, record) -> bool:
  """Returns whether there is a run to resume; refuses to overwrite one, or to resume it
  with another config (or, unless allowed, another policy: :func:`_check_policy`, which
  compares the policies' ``record(policy, text)``, the model's ``Model.record``)."""
  saved = workdir / "config.json"
  ckpts = workdir / "checkpoints"
  has_run = ckpts.exists() and any(p.name.isdigit() for p in ckpts.iterdir())
  if has_run and not resume:
    raise FileExistsError(f"{workdir} already holds a training run; pass --resume to "
                          "continue it or choose a new workdir")
  logged = workdir / "metrics.jsonl"
  if not has_run and logged.exists() and metrics_log.read_rows(logged):
    if resume:
      raise ValueError(f"--resume: the run in {workdir} saved no checkpoint "
                       "(train.checkpoints=False), so it cannot be resumed; choose a new "
                       "workdir")
    raise FileExistsError(f"{workdir} already holds a training run that saved no "
                          "checkpoint (its metrics.jsonl has rows); choose a new workdir")
  old = None
  if has_run:
    latest = max(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())
    if cfg.train.steps < latest:
      raise ValueError(f"--resume with train.steps {cfg.train.steps}, but the run in "
                       f"{workdir} has reached step {latest} (its latest checkpoint): "
                       f"train.steps must be >= {latest}; nothing was changed")
  source = saved
  if has_run and saved.exists():
    old = run_config.with_defaults(run_config.read_saved(saved))  # keys added since
  elif has_run:  # config.json lost: every checkpoint's meta holds the config
    source, old = _checkpoint_config(ckpts, saved)
  if has_run:
    _check_policy(ckpts, old and old["policy"], cfg.policy, policy, allow_policy_change,
                  record, stream)
  if old is not None:
    # train.steps may grow, unless the LR schedule follows it (optim.total_steps = 0).
    allowed = {"policy", *run_config.RESUME_MAY_CHANGE}
    if old["optim"]["total_steps"]:
      allowed.add("train.steps")
    new = json.loads(cfg.to_json())
    diff = _config_changes(old, new)
    changed = [k for k in diff if k not in allowed]
    if changed:
      raise ValueError(f"--resume with a config that differs from {source} in {changed}; "
                       f"only {', '.join(run_config.RESUME_MAY_CHANGE)} may change, "
                       "train.steps only with optim.total_steps set, and the policy with "
                       "--allow_policy_change (docs/reliability.md: What may change on resume)")
    for key in diff:
      if key != "policy":
        a, b = (_get(c, key) for c in (old, new))
        print(f"[train] --resume changes {key}: {a!r} -> {b!r}", file=stream or sys.stderr,
              flush=True)
  return has_run


def _get(config: dict, dotted: str):
  for part in dotted.split("."):
    config = config.get(part) if isinstance(config, dict) else None
  return config


def _checkpoint_config(ckpts: pathlib.Path, saved: pathlib.Path) -> tuple[str, dict]:
  """(where, config dict) of the newest checkpoint whose meta holds the run's config, for
  a run whose ``config.json`` (``saved``) is missing; raises ValueError if none does."""
  for step, meta in _readable(ckpts, ckpt_lib.saved_meta):
    config = meta.get("config")
    if isinstance(config, dict):
      return f"the config of checkpoint {ckpts / str(step)}", run_config.with_defaults(config)
  raise ValueError(f"--resume: {saved} is missing and no checkpoint in {ckpts} holds the "
                   "run's config, so the resumed config cannot be checked against it")


def _readable(ckpts: pathlib.Path, read):
  """``(step, read(ckpts, step))`` of the checkpoints whose meta reads, newest first (a
  torn save is passed over: the restore reports the damage)."""
  for step in sorted((int(p.name) for p in ckpts.iterdir() if p.name.isdigit()), reverse=True):
    try:
      value = read(ckpts, step)
    except Exception:  # pylint: disable=broad-except  # a torn save: try the one before
      continue
    yield step, value


def _latest_policy(ckpts: pathlib.Path):
  """(step, policy record or None) of the newest checkpoint whose meta reads; (None, None)
  when none does."""
  return next(_readable(ckpts, ckpt_lib.saved_policy), (None, None))


def _check_policy(ckpts, old_expr, expr: str, policy, allow: bool, record, stream) -> None:
  """Raises :class:`PolicyMismatchError` (or, if ``allow``, warns) when the policy record
  of the newest checkpoint (else ``config.json``'s expression ``old_expr``) is not
  ``policy``'s."""
  step, saved = _latest_policy(ckpts)
  current = record(policy, expr)
  if saved is not None:
    diff, old_expr = ckpt_lib.policy_difference(saved, current), saved.get("expression")
  else:
    diff = None if old_expr in (None, current["expression"]) else "the expressions differ"
  if diff is None:
    return
  where = f"checkpoint {ckpts / str(step)}" if saved is not None else "its config.json"
  if not allow:
    raise PolicyMismatchError(
        f"--resume under another precision policy: the run was trained with policy "
        f"{old_expr!r} ({where}), the config asks for {expr!r} ({diff}). Resume with "
        f"policy={old_expr!r}, or pass --allow_policy_change "
        "(train(..., allow_policy_change=True)) to continue under the new policy")
  print(f"warning: --allow_policy_change: the run was trained with policy {old_expr!r} "
        f"({where}) and continues under policy {expr!r} ({diff})",
        file=stream or sys.stderr, flush=True)
