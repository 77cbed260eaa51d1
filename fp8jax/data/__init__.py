"""Text data for training and studies: sources, tokenizers, packing and iteration.

``pipeline.make_batches`` builds the batches of every source: the embedded corpus packed in
memory; document shards (``.json.gz`` such as the allenai/c4 files, ``.jsonl``, ``.txt``,
Parquet, TFRecord) streamed with flat memory (``shards``, ``stream``); a corpus tokenized
once by ``prepare`` into ArrayRecord (``prepared``); or a prepared tfds dataset
(``tfds_source``). ``bpe`` trains the byte-level BPE tokenizer, ``fast_bpe`` encodes with
it exactly and fast.

Nothing here imports TensorFlow, tensorflow-datasets, grain, array-record or pyarrow at
import time.
"""
