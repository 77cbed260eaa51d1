"""Minimal, torch-free safetensors reading and writing with NumPy.

Format: 8-byte little-endian header length, a JSON header mapping tensor names to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the end of the
header) plus optional ``__metadata__``, then the raw little-endian bytes. Reads are
memory-mapped, one tensor at a time.
"""

from __future__ import annotations

import json
import pathlib
import struct

import ml_dtypes
import numpy as np

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
          "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32, "U8": np.uint8,
          "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}
_NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


class SafetensorsError(ValueError):
  """A safetensors file that cannot be read (truncated, corrupt, unknown dtype)."""


def read_header(path: str | pathlib.Path) -> tuple[dict, int]:
  """(header without ``__metadata__``, byte offset of the data section)."""
  path = pathlib.Path(path)
  size = path.stat().st_size
  with open(path, "rb") as f:
    raw = f.read(8)
    if len(raw) < 8:
      raise SafetensorsError(f"{path}: too short to be a safetensors file")
    (n,) = struct.unpack("<Q", raw)
    if n > size - 8:
      raise SafetensorsError(f"{path}: header length {n} exceeds the file size {size}")
    try:
      header = json.loads(f.read(n))
    except json.JSONDecodeError as e:
      raise SafetensorsError(f"{path}: corrupt header ({e})") from None
  header.pop("__metadata__", None)
  for name, info in header.items():
    if info.get("dtype") not in DTYPES:
      raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {info.get('dtype')}")
    begin, end = info["data_offsets"]
    want = int(np.prod(info["shape"])) * np.dtype(DTYPES[info["dtype"]]).itemsize
    if end - begin != want or 8 + n + end > size:
      raise SafetensorsError(f"{path}: tensor {name} does not fit its shape or the file")
  return header, 8 + n


def load(path: str | pathlib.Path, name: str, header: dict, data_start: int) -> np.ndarray:
  """One tensor as a read-only memory map."""
  info = header[name]
  begin, _ = info["data_offsets"]
  return np.memmap(path, dtype=DTYPES[info["dtype"]], mode="r", offset=data_start + begin,
                   shape=tuple(info["shape"]))


def write(path: str | pathlib.Path, names_shapes_dtypes: list[tuple[str, tuple, np.dtype]],
          produce, metadata: dict | None = None) -> None:
  """Writes tensors one at a time: ``produce(name)`` returns each array when needed.

  Args:
    path: output file.
    names_shapes_dtypes: the tensors, in file order.
    produce: callable name -> np.ndarray of the declared shape and dtype.
    metadata: optional string-to-string ``__metadata__``.
  """
  header, offset = {}, 0
  for name, shape, dtype in names_shapes_dtypes:
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    header[name] = {"dtype": _NAMES[np.dtype(dtype)], "shape": list(shape),
                    "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  if metadata:
    header["__metadata__"] = metadata
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for name, shape, dtype in names_shapes_dtypes:
      array = np.ascontiguousarray(produce(name), dtype=dtype)
      if array.shape != tuple(shape):
        raise ValueError(f"tensor {name}: produced shape {array.shape}, declared {shape}")
      f.write(array.tobytes())
