"""Training a byte-level BPE tokenizer (HF ``tokenizers``) on a sample of a corpus.

    meta = train_bpe(["c4/en/c4-train.*.json.gz"], "out/tok8k", vocab_size=8192)

The tokenizer (``tokenizer.json``, readable by ``tokenizers`` and ``transformers``):

* pre-tokenization by ASCII character classes (:data:`PATTERN`): runs of letters (any
  character outside ASCII digits, punctuation and whitespace counts as a letter), of
  digits and of punctuation, each taking one leading space, and whitespace runs, GPT-2
  style; then each pre-token's UTF-8 bytes map to the 256 byte-level symbols, so every
  text encodes without an unknown token;
* BPE merges learnt on the sample up to ``vocab_size`` ids in all;
* special tokens :data:`EOS` (id 0, appended after every document) and :data:`PAD` (id 1).

Because the classes are ASCII, pre-tokens can be found on UTF-8 bytes with array
operations: :mod:`fp8jax.data.fast_bpe` encodes with this tokenizer exactly (the tests
check it against ``tokenizers``) and several times faster, for ``prepare_data``.
``tokenizer_meta.json`` records the vocabulary size, EOS/pad ids and the sample.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import pathlib
import sys

import numpy as np

from fp8jax.data import progress, shards, synthetic

EOS, PAD = "<|endoftext|>", "<|pad|>"
WHITESPACE = " \t\n\r\x0b\x0c"
"""The whitespace class: ASCII space, tab, newline, carriage return, VT, FF."""
_WS = r" \t\n\r\x0B\x0C"
_PUNCT = r"!-/:-@\[-`{-~"  # ASCII punctuation: 0x21-0x2F, 0x3A-0x40, 0x5B-0x60, 0x7B-0x7E
PATTERN = (rf" ?[^{_WS}0-9{_PUNCT}]+| ?[0-9]+| ?[{_PUNCT}]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+")
"""The pre-tokenizer's regular expression (isolated matches)."""


def build(vocab_size: int):
  """(an untrained ``tokenizers.Tokenizer`` of this design, its ``BpeTrainer``)."""
  from tokenizers import (  # pylint: disable=import-outside-toplevel
    Regex,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    trainers,
  )

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                special_tokens=[EOS, PAD], show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  return tok, trainer


def sample_documents(inputs, sample_bytes: int, field: str = "text", seed: int = 0,
                     skip_bad: bool = False, stats: dict | None = None, log=None):
  """Yields documents for training: from the shards in a seeded order, the first ones of
  each shard, at most ``sample_bytes / min(shards, 8)`` UTF-8 bytes per shard, until
  ``sample_bytes`` in all. ``stats`` receives the shards used, documents and bytes.
  ``inputs == ["synthetic:<MB>"]``: the generated corpus (:mod:`fp8jax.data.synthetic`)
  of that size, in order, instead of shards."""
  if len(inputs) == 1 and str(inputs[0]).startswith("synthetic:"):
    yield from _synthetic_documents(str(inputs[0]), sample_bytes, stats)
    return
  files = shards.list_shards(inputs)
  order = np.random.default_rng(seed).permutation(len(files))
  per_shard = max(sample_bytes // min(len(files), 8), 1)
  stats = stats if stats is not None else {}
  stats.update(shards=[], documents=0, bytes=0)
  bar = progress.Progress(sample_bytes, "tokenizer sample", log, every=10)
  for i in order:
    if stats["bytes"] >= sample_bytes:
      break
    stats["shards"].append(files[i].name)
    taken = 0
    with shards.ShardReader(files[i], field, skip_bad=skip_bad) as reader:
      for _, text in reader:
        size = len(text.encode("utf-8"))
        stats["documents"], stats["bytes"], taken = (stats["documents"] + 1,
                                                     stats["bytes"] + size, taken + size)
        bar.update(stats["bytes"], f"{progress.format_bytes(stats['bytes'])} from "
                   f"{len(stats['shards'])} shards")
        yield text
        if taken >= per_shard or stats["bytes"] >= sample_bytes:
          break
  bar.update(stats["bytes"], f"{progress.format_bytes(stats['bytes'])} from "
             f"{len(stats['shards'])} shards", force=True)
  bar.close()


def _synthetic_documents(source: str, sample_bytes: int, stats: dict | None):
  """The documents of ``synthetic:<MB>``, at most ``sample_bytes`` UTF-8 bytes of them."""
  try:
    megabytes = float(source.split(":", 1)[1])
  except ValueError:
    raise ValueError(f"tokenizer input {source!r}: expected 'synthetic:<MB>', e.g. "
                     "'synthetic:8'") from None
  stats = stats if stats is not None else {}
  stats.update(shards=[source], documents=0, bytes=0)
  for text in synthetic.corpus(megabytes):
    if stats["bytes"] >= sample_bytes:
      break
    stats["documents"] += 1
    stats["bytes"] += len(text.encode("utf-8"))
    yield text


def train_bpe(inputs, out, vocab_size: int = 8192, sample_bytes: int = 256 * 10**6,
              field: str = "text", seed: int = 0, skip_bad: bool = False, log=None) -> dict:
  """Trains the tokenizer on a sample of the shards of ``inputs`` and writes
  ``out/tokenizer.json`` and ``out/tokenizer_meta.json``; returns the metadata.

  Raises:
    ValueError: ``vocab_size`` leaves no room for merges (< 259), ``sample_bytes`` is not
      positive, or the sample is empty.
  """
  log = log or sys.stderr
  if vocab_size < 259:
    raise ValueError(f"vocab_size {vocab_size} is below the 256 byte symbols + 2 special "
                     "tokens + 1 merge")
  if sample_bytes <= 0:
    raise ValueError(f"the sample size must be > 0 bytes, got {sample_bytes}")
  stats = {}
  docs = sample_documents(inputs, sample_bytes, field, seed, skip_bad, stats, log)
  first = next(docs, None)  # opens the inputs: a missing one is the only line printed
  out = pathlib.Path(out).expanduser()
  out.mkdir(parents=True, exist_ok=True)
  tok, trainer = build(vocab_size)
  print(f"[tokenizer] sampling {progress.format_bytes(sample_bytes)} of text, then learning "
        f"{vocab_size} ids", file=log, flush=True)
  tok.train_from_iterator(itertools.chain(() if first is None else (first,), docs), trainer)
  if stats["documents"] == 0:
    raise ValueError(f"no documents in field {field!r} of {inputs}")
  path = out / "tokenizer.json"
  tok.save(str(path))
  digest = hashlib.sha256(path.read_bytes()).hexdigest()
  meta = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "requested_vocab_size":
          vocab_size, "eos_token": EOS, "eos_id": tok.token_to_id(EOS), "pad_token": PAD,
          "pad_id": tok.token_to_id(PAD), "pattern": PATTERN, "sha256": digest,
          "fingerprint": "sha256:" + digest[:32], "sample": {**stats, "seed": seed,
                                                             "field": field}}
  (out / "tokenizer_meta.json").write_text(json.dumps(meta, indent=2))
  print(f"[tokenizer] {path}: {meta['vocab_size']} ids (EOS {meta['eos_id']}, pad "
        f"{meta['pad_id']}) from {stats['documents']} documents, "
        f"{progress.format_bytes(stats['bytes'])}", file=log, flush=True)
  return meta
