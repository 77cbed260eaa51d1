"""Tokenize a corpus once into ArrayRecord files with a manifest (:mod:`.prepared`).

    manifest = prepare(["c4/en/c4-train.*.json.gz"], "out/c4_8k", "tokenizer.json")

Each source shard is one unit of work, done by one of ``workers`` processes: its
documents are tokenized in batches and written to ``tokens/<unit>.array_record.tmp``;
the unit's statistics (documents, tokens, the source's size and SHA-256, skipped bad
records) go to ``tokens/<unit>.json.tmp``; then both are renamed, the ``.json`` last. A
unit counts as done only once its ``.json`` exists, so a run killed at any point resumes
by redoing the unfinished units from scratch (their leftovers are deleted): no record is
written twice or lost. ``manifest.json`` is written when every unit is done. Worker
processes end with the process that started them, even when it is killed (SIGKILL). The folder
is locked while it is written (:mod:`fp8jax.data.folder_lock`): a second preparation into
it stops at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import datetime
import errno
import hashlib
import json
import multiprocessing as mp
import os
import pathlib
import queue
import signal
import sys
import threading
import time

from fp8jax.data import folder_lock, prepared, progress, shards, stream, tokenizers

_WINDOW = 1024  # documents tokenized per batch
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_worker = {}  # per worker process: the tokenizer and the progress queue


def _dtype(vocab: int) -> str:
  return "uint16" if vocab <= 1 << 16 else "uint32"


def _plan(sources, tok, tok_spec: str, field: str) -> dict:
  return {"format": prepared.FORMAT, "field": field, "dtype": _dtype(tok.vocab_size),
          "tokenizer": {"spec": str(tok_spec), "fingerprint": tok.fingerprint,
                        "vocab_size": int(tok.vocab_size), "eos_id": int(tok.eos_id)},
          "sources": [{"name": p.name, "path": str(p.resolve()), "bytes": p.stat().st_size}
                      for p in sources]}


def _identity(plan: dict) -> list:
  """What must match for a preparation to be resumed: format, field, dtype, tokenizer,
  the sources' names and sizes."""
  return [plan["format"], plan["field"], plan["dtype"], plan["tokenizer"]["fingerprint"],
          [(s["name"], s["bytes"]) for s in plan["sources"]]]


def _init_worker(tok_spec: str, progress_queue, parent: int | None = None) -> None:
  if parent is not None:
    _die_with_parent(parent)
  _worker["tok"] = tokenizers.get_tokenizer(tok_spec)
  _worker["queue"] = progress_queue


def _die_with_parent(parent: int) -> None:
  """Ends this worker process when its parent (pid ``parent``) dies, however it dies
  (SIGKILL included): on Linux the kernel sends SIGKILL (``PR_SET_PDEATHSIG``), and
  everywhere a daemon thread polls the parent pid every 0.2 s. With the workers gone, the
  multiprocessing resource tracker reads EOF and ends too."""
  if sys.platform.startswith("linux"):
    try:
      ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except (OSError, AttributeError):  # no prctl: the thread below still watches
      pass

  def watch():
    while os.getppid() == parent:
      time.sleep(0.2)
    os._exit(1)  # pylint: disable=protected-access  # no cleanup: the parent is gone

  if os.getppid() != parent:  # died before the watch began
    os._exit(1)  # pylint: disable=protected-access
  threading.Thread(target=watch, name="fp8jax-parent-watch", daemon=True).start()


def _sha256(path) -> str:
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


# What the ArrayRecord (Riegeli) writer says when the file system refuses a write: its
# errors are RuntimeErrors that quote the system's message.
_DISK_MESSAGES = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
                  "Read-only file system": errno.EROFS}


def disk_error(e: Exception, path) -> Exception:
  """``e`` as the ``OSError`` of the file system's refusal (full disk, quota, read-only)
  that it quotes, naming ``path``; else ``e`` itself."""
  for text, code in _DISK_MESSAGES.items():
    if text in str(e):
      return OSError(code, os.strerror(code), str(path))
  return e


def prepare_unit(unit: int, path: str, out: str, field: str, dtype: str,
                 skip_bad: bool) -> dict:
  """Tokenizes shard ``path`` into ``out/tokens/<unit>.array_record``; returns its stats."""
  from array_record.python import (  # pylint: disable=import-outside-toplevel
    array_record_module,
  )

  final = pathlib.Path(out) / "tokens" / f"{unit:05d}.array_record"
  tmp = final.with_name(final.name + ".tmp")
  try:
    return _write_unit(array_record_module, unit, path, field, dtype, skip_bad, final, tmp)
  except RuntimeError as e:
    raise disk_error(e, tmp) from e


def _write_unit(array_record_module, unit, path, field, dtype, skip_bad, final, tmp) -> dict:
  tok, q = _worker["tok"], _worker.get("queue")
  skips = shards.Skips(stream=False)
  stats = {"unit": unit, "documents": 0, "tokens": 0, "text_bytes": 0, "records": 0}
  writer = array_record_module.ArrayRecordWriter(str(tmp), "group_size:1,uncompressed")
  reported = 0
  try:
    with shards.ShardReader(path, field, skip_bad=skip_bad, skips=skips) as reader:
      texts, it = [], iter(reader)
      while True:
        record = next(it, None)
        if record is not None:
          texts.append(record[1])
          stats["records"] = record[0] + 1
        if texts and (record is None or len(texts) == _WINDOW):
          for ids in stream.encode_all(tok, texts):
            writer.write(ids.astype(dtype).tobytes())
            stats["tokens"] += len(ids)
          stats["documents"] += len(texts)
          text_bytes = sum(len(t) if t.isascii() else len(t.encode("utf-8")) for t in texts)
          stats["text_bytes"] += text_bytes
          if q is not None:
            q.put((unit, reader.bytes_read - reported, text_bytes))
            reported = reader.bytes_read
          texts = []
        if record is None:
          break
  finally:
    writer.close()
  size = pathlib.Path(path).stat().st_size
  if q is not None:
    q.put((unit, size - reported, 0))
  stats.update(source=str(path), name=pathlib.Path(path).name, bytes=size,
               sha256=_sha256(path), skipped=skips.count, skipped_examples=skips.examples,
               file=f"tokens/{final.name}", file_bytes=tmp.stat().st_size)
  meta = final.with_suffix(".json")
  meta.with_name(meta.name + ".tmp").write_text(json.dumps(stats))
  tmp.replace(final)
  meta.with_name(meta.name + ".tmp").replace(meta)
  return stats


def _done_units(out: pathlib.Path, plan: dict) -> dict[int, dict]:
  """Units whose statistics exist and match the plan's source; removes leftovers."""
  tokens = out / "tokens"
  tokens.mkdir(parents=True, exist_ok=True)
  for tmp in tokens.glob("*.tmp"):
    tmp.unlink()
  done = {}
  for meta in tokens.glob("*.json"):
    stats = json.loads(meta.read_text())
    src = plan["sources"][stats["unit"]]
    if (stats["name"], stats["bytes"]) == (src["name"], src["bytes"]) and (
        out / stats["file"]).is_file():
      done[stats["unit"]] = stats
  return done


def _manifest(plan: dict, units: list[dict], seconds: float) -> dict:
  m = {k: plan[k] for k in ("format", "field", "dtype", "tokenizer")}
  m["sources"] = [{"name": u["name"], "path": u["source"], "bytes": u["bytes"],
                   "sha256": u["sha256"], "records": u["records"], "documents": u["documents"],
                   "skipped": u["skipped"]} for u in units]
  m["files"] = [{"name": u["file"], "documents": u["documents"], "tokens": u["tokens"],
                 "bytes": u["file_bytes"]} for u in units]
  m["documents"] = sum(u["documents"] for u in units)
  m["tokens"] = sum(u["tokens"] for u in units)
  m["text_bytes"] = sum(u["text_bytes"] for u in units)
  m["skipped"] = {"count": sum(u["skipped"] for u in units),
                  "examples": [e for u in units for e in u["skipped_examples"]][:50]}
  m["complete"] = True
  m["created"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
  m["seconds_last_run"] = round(seconds, 1)
  m["hash"] = prepared.manifest_hash(m)
  return m


def prepare(inputs, out, tokenizer: str = "bytes", field: str = "text",
            workers: int | None = None, skip_bad: bool = False, log=None) -> dict:
  """Tokenizes the shards of ``inputs`` (files, folders, globs) into ``out``; resumes an
  unfinished preparation of the same inputs. Returns the manifest.

  Raises:
    FileNotFoundError, ValueError: bad inputs, or ``out`` holds another preparation.
    fp8jax.data.shards.BadRecordError: a bad record (without ``skip_bad``); the units
      already finished are kept for the rerun.
  """
  log = log or sys.stderr
  out = pathlib.Path(out).expanduser()
  sources = shards.list_shards(inputs)
  tok = tokenizers.get_tokenizer(tokenizer)
  plan = _plan(sources, tok, tokenizer, field)
  plan_path = out / "plan.json"
  if plan_path.is_file() and _identity(json.loads(plan_path.read_text())) != _identity(plan):
    raise ValueError(f"{out} holds a preparation of other inputs, tokenizer or field "
                     f"({plan_path}); choose another --out")
  if prepared.is_prepared(out):
    manifest = prepared.read_manifest(out)
    print(f"[prepare] {out} is already prepared (hash {manifest['hash']})", file=log)
    return manifest
  with folder_lock.hold(out):  # one writer: a second preparation here stops at once
    if prepared.is_prepared(out):  # finished while this one was starting
      return prepared.read_manifest(out)
    return _prepare_locked(out, sources, plan, plan_path, workers, skip_bad, log)


def _prepare_locked(out, sources, plan, plan_path, workers, skip_bad, log) -> dict:
  plan_path.write_text(json.dumps(plan, indent=2))
  done = _done_units(out, plan)
  todo = [i for i in range(len(sources)) if i not in done]
  total = sum(s["bytes"] for s in plan["sources"])
  workers = max(1, min(workers or os.cpu_count() or 1, len(todo) or 1))
  print(f"[prepare] {len(sources)} shards ({progress.format_bytes(total)}), {len(done)} done "
        f"before; {len(todo)} to tokenize with {workers} processes into {out}", file=log)
  t0 = time.perf_counter()
  if todo:
    _run(todo, sources, out, plan, done, workers, skip_bad, total, log)
  manifest = _manifest(plan, [done[i] for i in range(len(sources))], time.perf_counter() - t0)
  tmp = out / (prepared.MANIFEST + ".tmp")
  tmp.write_text(json.dumps(manifest, indent=2))
  tmp.replace(out / prepared.MANIFEST)
  skipped = manifest["skipped"]["count"]
  print(f"[prepare] done: {manifest['documents']} documents, {manifest['tokens']} tokens"
        + (f", {skipped} bad records skipped" if skipped else "")
        + f"; manifest hash {manifest['hash']}", file=log)
  return manifest


class _Meter:
  """Progress of the job: input bytes read (of ``total``) and text bytes tokenized."""

  def __init__(self, total: int, read: int, done: dict, n_sources: int, workers: int, log):
    self.bar = progress.Progress(total, "prepare", log)
    self.total, self.read, self.text, self.done = total, read, 0, done
    self.n_sources, self.workers, self.t0 = n_sources, workers, time.perf_counter()

  def put(self, item) -> None:
    """Takes a worker's ``(unit, input bytes, text bytes)`` increment."""
    self.read, self.text = self.read + item[1], self.text + item[2]
    self.show()

  def show(self, force: bool = False) -> None:
    rate = self.text / 1e6 / max(time.perf_counter() - self.t0, 1e-9)
    self.bar.update(self.read, f"{len(self.done)}/{self.n_sources} shards, "
                    f"{progress.format_bytes(self.read)}/{progress.format_bytes(self.total)}",
                    f"text {rate:.1f} MB/s ({rate / self.workers:.1f}/process)", force=force)


def _run(todo, sources, out, plan, done, workers, skip_bad, total, log) -> None:
  meter = _Meter(total, sum(done[i]["bytes"] for i in done), done, len(sources), workers, log)
  args = lambda i: (i, str(sources[i]), str(out), plan["field"], plan["dtype"], skip_bad)
  try:
    if workers == 1:  # in this process
      _init_worker(plan["tokenizer"]["spec"], meter)
      for i in todo:
        _finish(prepare_unit(*args(i)), done, log)
      return
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                initargs=(plan["tokenizer"]["spec"], q, os.getpid())) as pool:
      pending = {pool.submit(prepare_unit, *args(i)) for i in todo}
      try:
        while pending:
          finished, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_COMPLETED)
          for f in finished:
            _finish(f.result(), done, log)  # re-raises a worker's error (e.g. a bad record)
          while True:
            try:
              meter.put(q.get_nowait())
            except queue.Empty:
              break
          meter.show()
      except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
          proc.terminate()  # their unfinished units' .tmp files are deleted by the next run
        raise
  finally:
    meter.show(force=True)
    meter.bar.close()
    _worker.clear()


def _finish(stats: dict, done: dict, log) -> None:
  done[stats["unit"]] = stats
  for example in stats["skipped_examples"]:
    print(f"warning: skipped bad record: {example}", file=log)
