"""Text data for training and studies: sources, tokenizers, packing and iteration.

Nothing here imports TensorFlow, tensorflow-datasets or grain at import time.
"""
