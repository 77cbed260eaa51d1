"""The evaluation data of a comparison sweep: its windows of batches, drawn from the
training run's data source (or another, by override), and the check that the checkpoints
were trained on that data."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import orbax.checkpoint as ocp

from fp8jax.data import pipeline, progress, tokenizers
from fp8jax.train import run_config


@dataclasses.dataclass(frozen=True)
class Windows:
  """Evaluation batches: ``batches`` consecutive batches at each data ``offset`` (in
  batches) of the training data source, shuffled with ``seed``.

  Raises:
    ValueError: an offset is negative or repeated, or ``batches``, ``batch_size`` is below
      1 or ``seq_len`` below 0 (the message names the field and its flag).
  """
  offsets: tuple[int, ...] = (0,)
  batches: int = 2
  batch_size: int = 8
  seq_len: int = 0        # 0: the training run's
  seed: int = 1234
  split: str = ""         # "": the training run's

  def __post_init__(self):
    offsets = list(self.offsets)
    if not offsets or any(o < 0 for o in offsets):
      raise ValueError(f"offsets (--offsets) must be one or more data offsets >= 0, in "
                       f"batches; got {offsets}")
    if len(set(offsets)) != len(offsets):
      raise ValueError(f"offsets (--offsets) must not repeat an offset; got {offsets}")
    for name, low in (("batches", 1), ("batch_size", 1), ("seq_len", 0)):
      if getattr(self, name) < low:
        raise ValueError(f"{name} (--{name}) must be >= {low}; got {getattr(self, name)}")


def data_config(train_cfg, data: dict | None = None) -> dict:
  """The training run's data settings, with ``data`` (e.g. from
  :func:`fp8jax.data.pipeline.override`: a prepared folder or shards) put over them."""
  d = {"skip_bad_records": False, **dict(train_cfg.data), **(data or {})}
  d["paths"], d["data_dir"] = tuple(d["paths"]), d["data_dir"] or None
  return d


def _trained_on(ckpt, step: int) -> str | None:
  """The data id in checkpoint ``step``'s data position (None: not recorded)."""
  try:
    position = ckpt.manager.restore(step, args=ocp.args.Composite(
        data=ocp.args.JsonRestore())).data
  except Exception:  # pylint: disable=broad-except  # a damaged one is reported when read
    return None
  return position.get("data") if isinstance(position, dict) else None


def check_data(ckpt, steps, data_id: str, allow_other_data: bool = False) -> None:
  """Raises ValueError if a checkpoint was trained on data other than ``data_id``."""
  other = {s: d for s in steps if (d := _trained_on(ckpt, s)) not in (None, data_id)}
  if other and not allow_other_data:
    step, trained = next(iter(other.items()))
    raise ValueError(f"checkpoints {sorted(other)} were trained on data {trained}, but the "
                     f"evaluation reads {data_id} (checkpoint {step}); compare on the "
                     "training data, or pass allow_other_data (--allow_other_data) to "
                     "compare anyway")


def eval_batches(train_cfg, windows: Windows, data: dict | None = None,
                 stream=None) -> dict[tuple[int, int], np.ndarray]:
  """{(offset, batch index): this process's int32 [batch_size / processes, S] tokens}.

  Each offset is reached by reading the stream from its start; a long read shows a
  progress line with its ETA on ``stream`` (default stderr).

  Raises:
    ValueError: ``windows.seq_len`` exceeds the model's positions (as ``train`` refuses).
  """
  d = data_config(train_cfg, data)
  positions = run_config.model(train_cfg).max_len
  if positions and (windows.seq_len or d["seq_len"]) > positions:
    raise ValueError(f"seq_len (--seq_len) {windows.seq_len} exceeds the model's "
                     f"max_position_embeddings {positions}")
  tok = tokenizers.get_tokenizer(d["tokenizer"])
  out = {}
  for offset in windows.offsets:
    it = pipeline.make_batches(
        d["source"], tok, seq_len=windows.seq_len or d["seq_len"],
        global_batch=windows.batch_size, seed=windows.seed, process_index=jax.process_index(),
        process_count=jax.process_count(), data_dir=d["data_dir"], paths=d["paths"],
        split=windows.split or d["split"], field=d["field"],
        skip_bad_records=d["skip_bad_records"])
    skip = progress.Progress(offset, f"compare: reading to data offset {offset}", stream)
    for done in range(1, offset + 1):
      next(it)
      skip.update(done, f"{done}/{offset} batches")
    skip.close()
    for b in range(windows.batches):
      out[(offset, b)] = next(it)
    it.close()  # stops a streaming source's reading thread
  return out
