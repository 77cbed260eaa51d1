"""Text data for training and studies: sources, tokenizers, packing and iteration.

``pipeline.make_batches`` builds the batches of every source: the embedded corpus and local
files packed in memory, or any prepared tfds dataset such as C4 streamed from ArrayRecord
files (``tfds_source``).

Nothing here imports TensorFlow, tensorflow-datasets or grain at import time.
"""
