"""Torch-free safetensors IO (``fp8jax.models.safetensors_io``): the byte layout written,
round trips of every dtype, read-only memory maps, and truncated or corrupt files refused
with messages that name the problem."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from fp8jax.models import safetensors_io as st


def _file(path, header, data=b""):
  """A safetensors file written by hand: header length, JSON header, data."""
  blob = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
  return path


def test_safetensors_round_trip_and_corruption(tmp_path):
  rng = np.random.default_rng(0)
  tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32),
             "b": rng.standard_normal(7).astype(ml_dtypes.bfloat16)}
  path = tmp_path / "x.safetensors"
  st.write(path, [(k, v.shape, v.dtype) for k, v in tensors.items()], tensors.__getitem__)
  header, start = st.read_header(path)
  for k, v in tensors.items():
    np.testing.assert_array_equal(st.load(path, k, header, start), v)
  raw = path.read_bytes()
  (tmp_path / "cut.safetensors").write_bytes(raw[:-4])
  with pytest.raises(st.SafetensorsError, match="does not fit"):
    st.read_header(tmp_path / "cut.safetensors")
  (tmp_path / "bad.safetensors").write_bytes(raw[:8] + b"X" + raw[9:])
  with pytest.raises(st.SafetensorsError, match="corrupt header"):
    st.read_header(tmp_path / "bad.safetensors")


def test_the_file_is_a_header_length_a_padded_json_header_then_little_endian_data(tmp_path):
  path = tmp_path / "x.safetensors"
  tensors = {"w": np.array([1.0, -2.0], np.float32), "i": np.array([[7], [-1], [3]], np.int32)}
  st.write(path, [("w", (2,), np.float32), ("i", (3, 1), np.int32)], tensors.__getitem__,
           metadata={"format": "pt"})
  raw = path.read_bytes()
  (n,) = struct.unpack("<Q", raw[:8])
  assert n % 8 == 0  # the header padded with spaces
  assert json.loads(raw[8:8 + n]) == {
      "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "i": {"dtype": "I32", "shape": [3, 1], "data_offsets": [8, 20]},
      "__metadata__": {"format": "pt"}}
  assert raw[8 + n:] == struct.pack("<2f3i", 1.0, -2.0, 7, -1, 3)
  header, start = st.read_header(path)
  assert start == 8 + n and set(header) == {"w", "i"}  # the metadata left out


@pytest.mark.parametrize("name", sorted(st.DTYPES))
def test_every_dtype_round_trips_under_its_safetensors_name(tmp_path, name):
  dtype = np.dtype(st.DTYPES[name])
  values = np.array([[0, 1, 2], [3, 4, 5]]).astype(dtype)  # exact in every dtype
  path = tmp_path / "x.safetensors"
  st.write(path, [("t", (2, 3), dtype)], lambda _: values)
  header, start = st.read_header(path)
  assert header["t"]["dtype"] == name
  got = st.load(path, "t", header, start)
  assert got.dtype == dtype and isinstance(got, np.memmap) and not got.flags.writeable
  np.testing.assert_array_equal(got.astype(np.float64), values.astype(np.float64))


def test_a_file_too_short_or_with_an_overlong_header_is_refused_by_name(tmp_path):
  short = tmp_path / "short.safetensors"
  short.write_bytes(b"\x01\x02")
  with pytest.raises(st.SafetensorsError, match=r"short.safetensors: too short to be a "
                                                r"safetensors file"):
    st.read_header(short)
  overlong = tmp_path / "long.safetensors"
  overlong.write_bytes(struct.pack("<Q", 1000) + b"{}")
  with pytest.raises(st.SafetensorsError, match=r"long.safetensors: header length 1000 exceeds "
                                                r"the file size 10"):
    st.read_header(overlong)


def test_a_tensor_of_unknown_dtype_or_of_too_few_bytes_is_refused_by_name(tmp_path):
  odd = _file(tmp_path / "odd.safetensors",
              {"x": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, bytes(16))
  with pytest.raises(st.SafetensorsError, match="tensor x has unsupported dtype F128"):
    st.read_header(odd)
  small = _file(tmp_path / "small.safetensors",
                {"y": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}, bytes(12))
  with pytest.raises(st.SafetensorsError, match="tensor y does not fit its shape or the file"):
    st.read_header(small)
  assert issubclass(st.SafetensorsError, ValueError)


def test_a_produced_array_of_another_shape_is_refused_naming_the_tensor(tmp_path):
  with pytest.raises(ValueError, match=r"tensor a: produced shape \(3,\), declared \(2,\)"):
    st.write(tmp_path / "x.safetensors", [("a", (2,), np.float32)],
             lambda _: np.zeros(3, np.float32))
