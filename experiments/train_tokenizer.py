"""Trains a byte-level BPE tokenizer on a sample of a corpus (the 2B study's has 8192 ids).

    python -m fp8jax.experiments.train_tokenizer \
        --input='/data/c4/en/c4-train.*-of-01024.json.gz' --out=$WORK/tok8k \
        --vocab_size=8192 [--sample_mb=256]

Writes ``OUT/tokenizer.json`` (for ``--config.data.tokenizer`` and ``prepare_data
--tokenizer``) and ``OUT/tokenizer_meta.json`` (vocabulary size, EOS and pad ids, the
sample). The logic is :func:`fp8jax.data.bpe.train_bpe`.
"""

import sys

from absl import flags

from fp8jax.experiments import _cli

_INPUT = flags.DEFINE_list("input", [], "Shard files, folders or globs, or 'synthetic:<MB>' "
                           "(the generated corpus of the data source of that name).")
_OUT = flags.DEFINE_string("out", "", "Output folder.")
_VOCAB = flags.DEFINE_integer("vocab_size", 8192, "Token ids in all (special tokens "
                              "included).")
_SAMPLE_MB = flags.DEFINE_float("sample_mb", 256, "MB of text to learn from.")
_FIELD = flags.DEFINE_string("field", "text", "Text field.")
_SEED = flags.DEFINE_integer("seed", 0, "Which shards the sample comes from.")
_SKIP_BAD = flags.DEFINE_bool("skip_bad_records", False, "Skip and count bad records.")


def main(argv):
  from fp8jax.train import multihost  # pylint: disable=import-outside-toplevel

  multihost.quiet_library_logs(flags.FLAGS["verbosity"].present)
  if len(argv) > 1:
    print(f"error: unexpected arguments {argv[1:]} (quote the --input globs)", file=sys.stderr)
    return 2
  from fp8jax.data import bpe, shards  # pylint: disable=import-outside-toplevel

  if not _INPUT.value or not _OUT.value:
    print("error: --input and --out are required", file=sys.stderr)
    return 2
  if not 0 < _SAMPLE_MB.value < float("inf"):
    print(f"error: --sample_mb must be a number of megabytes > 0, got {_SAMPLE_MB.value}",
          file=sys.stderr)
    return 2
  try:
    meta = bpe.train_bpe(_INPUT.value, _OUT.value, vocab_size=_VOCAB.value,
                         sample_bytes=int(_SAMPLE_MB.value * 1e6), field=_FIELD.value,
                         seed=_SEED.value, skip_bad=_SKIP_BAD.value)
  except (ValueError, FileNotFoundError, ImportError, shards.BadRecordError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"done: {_OUT.value}/tokenizer.json, {meta['vocab_size']} ids, EOS id "
        f"{meta['eos_id']}, pad id {meta['pad_id']}")
  return 0


if __name__ == "__main__":
  _cli.run(main)
