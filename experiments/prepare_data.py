"""Tokenizes a corpus once into ArrayRecord files with a manifest, for random access.

    python -m fp8jax.experiments.prepare_data \
        --input='/data/c4/en/c4-train.*-of-01024.json.gz' --out=$WORK/c4_8k \
        --tokenizer=$WORK/tok8k/tokenizer.json [--workers=16] [--skip_bad_records]

``--input`` takes shard files, folders or globs (comma-separated): ``.json.gz`` (the
allenai/c4 shards), ``.jsonl[.gz]``, ``.txt[.gz]``, ``.parquet`` or the TFRecord files of
the prepared tfds C4 (needs the ``tf`` extra). A progress line shows throughput and ETA.
Rerunning after a kill resumes: finished shards are kept, unfinished ones are redone. The
output folder is a training source (``--config.data.source=prepared
--config.data.data_dir=OUT``). The logic is :func:`fp8jax.data.prepare.prepare`.
"""

import sys

from absl import flags

from fp8jax.experiments import _cli

_INPUT = flags.DEFINE_list("input", [], "Shard files, folders or globs.")
_OUT = flags.DEFINE_string("out", "", "Output folder (resumable).")
_TOKENIZER = flags.DEFINE_string("tokenizer", "bytes", "'bytes' or a tokenizer.json path.")
_FIELD = flags.DEFINE_string("field", "text", "Text field (JSON key, Parquet column, "
                             "tf.Example feature).")
_WORKERS = flags.DEFINE_integer("workers", 0, "Processes (0: one per CPU core).")
_SKIP_BAD = flags.DEFINE_bool("skip_bad_records", False, "Skip and count bad records (a "
                              "corrupt gzip tail, a torn line, bad UTF-8, no text field) "
                              "instead of stopping at the first one.")


def main(argv):
  from fp8jax.train import multihost  # pylint: disable=import-outside-toplevel

  multihost.quiet_library_logs(flags.FLAGS["verbosity"].present)
  if len(argv) > 1:
    print(f"error: unexpected arguments {argv[1:]} (quote the --input globs)", file=sys.stderr)
    return 2
  from fp8jax.data import prepare, shards  # pylint: disable=import-outside-toplevel

  if not _INPUT.value or not _OUT.value:
    print("error: --input and --out are required", file=sys.stderr)
    return 2
  try:
    manifest = prepare.prepare(_INPUT.value, _OUT.value, _TOKENIZER.value, _FIELD.value,
                               workers=_WORKERS.value or None, skip_bad=_SKIP_BAD.value)
  except (ValueError, FileNotFoundError, ImportError, shards.BadRecordError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"done: {manifest['documents']} documents, {manifest['tokens']} tokens in "
        f"{_OUT.value} (manifest hash {manifest['hash']})")
  return 0


if __name__ == "__main__":
  _cli.run(main)
