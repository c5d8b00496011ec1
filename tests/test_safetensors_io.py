"""Our safetensors reader and writer against the reference `safetensors` library."""

import json
import math
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from ascendconv.errors import HeaderError, TruncatedFileError
from ascendconv.io.safetensors import NUMPY_DTYPES, TensorEntry, TensorReader, read_header
from ascendconv.io.writer import ShardWriter, TensorSpec, encode_header


def test_reads_what_the_library_writes(tmp_path):
    tensors = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.arange(5, dtype=np.int64),
        "c": np.array([[1.5, -2.0]], dtype=ml_dtypes.bfloat16),
    }
    path = tmp_path / "x.safetensors"
    save_file(tensors, str(path), metadata={"format": "np"})
    header = read_header(path)
    assert header.metadata == {"format": "np"}
    assert {n: (e.dtype, e.shape) for n, e in header.tensors.items()} == {
        "a": ("F32", (3, 4)),
        "b": ("I64", (5,)),
        "c": ("BF16", (1, 2)),
    }
    with TensorReader() as reader:
        for name, value in tensors.items():
            got = reader.read(header.tensors[name])
            assert got.dtype == value.dtype and np.array_equal(got, value)
        assert np.array_equal(reader.read_rows(header.tensors["a"], 1, 3), tensors["a"][1:3])


def test_writer_output_is_read_back_by_the_library(tmp_path):
    specs = [
        TensorSpec("w", "F8_E4M3", (2, 64)),
        TensorSpec("w_scale", "U8", (2, 2)),
        TensorSpec("empty", "F32", (0, 3)),
        TensorSpec("bias", "F32", (2,)),
    ]
    codes = np.arange(128, dtype=np.uint8).reshape(2, 64)
    writer = ShardWriter(tmp_path / "s.safetensors", specs, {"format": "pt"})
    writer.write("w", codes[:1])  # chunked writes of one tensor
    writer.write("w", codes[1:])
    writer.write("w_scale", np.array([[127, 128], [0, 254]], np.uint8))
    writer.write("bias", np.array([1.0, -1.0], np.float32))
    digest = writer.close()
    data = (tmp_path / "s.safetensors").read_bytes()
    import blake3

    assert digest == blake3.blake3(data).hexdigest()
    header_len = struct.unpack("<Q", data[:8])[0]
    assert (8 + header_len) % 8 == 0
    with safe_open(str(tmp_path / "s.safetensors"), "numpy") as f:
        assert set(f.keys()) == {"w", "w_scale", "empty", "bias"}
        assert f.metadata() == {"format": "pt"}
        assert f.get_tensor("w_scale").tolist() == [[127, 128], [0, 254]]
        assert f.get_tensor("bias").tolist() == [1.0, -1.0]
        assert f.get_slice("w").get_dtype() == "F8_E4M3"
    header = read_header(tmp_path / "s.safetensors")
    with TensorReader() as reader:
        assert np.array_equal(reader.read(header.tensors["w"]), codes)


def test_writer_refuses_out_of_order_overflow_and_short_shards(tmp_path):
    specs = [TensorSpec("a", "U8", (4,)), TensorSpec("b", "U8", (2,))]
    writer = ShardWriter(tmp_path / "s.safetensors", specs)
    with pytest.raises(RuntimeError, match="out of order"):
        writer.write("b", b"xx")
    with pytest.raises(RuntimeError, match="overflows"):
        writer.write("a", b"12345")
    writer.write("a", b"1234")
    with pytest.raises(RuntimeError, match="closed before 'b'"):
        writer.close()


def _raw_file(path, header: dict, data: bytes, pad: bool = True):
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-(8 + len(text)) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


@pytest.mark.parametrize(
    "header,data,error,words",
    [
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, TruncatedFileError, "truncated"),
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, HeaderError, "needs 8 bytes"),
        ({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, HeaderError, "contiguous"),
        ({"t": {"dtype": "X9", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, HeaderError, "unknown dtype"),
        ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, HeaderError, "invalid shape"),
        ({"t": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, HeaderError, "lacks"),
        ({"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0" * 3, HeaderError, "after the last"),
        ({"__metadata__": {"a": 1}}, b"", HeaderError, "__metadata__"),
    ],
)
def test_malformed_headers_are_named(tmp_path, header, data, error, words):
    path = _raw_file(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(error, match=words) as info:
        read_header(path)
    assert "bad.safetensors" in info.value.message


def test_garbage_and_short_files(tmp_path):
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(TruncatedFileError, match="too short"):
        read_header(short)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(TruncatedFileError, match="does not fit"):
        read_header(huge)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(HeaderError, match="not valid JSON"):
        read_header(garbage)


def test_encode_header_offsets_follow_spec_order():
    raw = encode_header([TensorSpec("z", "U8", (3,)), TensorSpec("a", "BF16", (2,))])
    header = json.loads(raw[8:])
    assert header["z"]["data_offsets"] == [0, 3] and header["a"]["data_offsets"] == [3, 7]
    assert list(header) == ["z", "a"]


_ODD_VALUES = st.one_of(st.integers(min_value=-2, max_value=2**64), st.booleans(), st.none(), st.floats(allow_nan=False), st.text(max_size=3))


@settings(max_examples=400, deadline=None)
@given(
    dtype=st.one_of(st.sampled_from(["F8_E4M3", "BF16", "F32", "U8", "I64"]), st.sampled_from(["F9", "bf16"]), _ODD_VALUES),
    shape=st.one_of(
        st.lists(st.integers(min_value=0, max_value=2**12), max_size=4),
        st.lists(st.one_of(st.integers(min_value=-1, max_value=2**40), st.booleans(), _ODD_VALUES), max_size=4),
        _ODD_VALUES,
    ),
    begin=st.one_of(st.integers(min_value=0, max_value=2**20), _ODD_VALUES),
    extra=st.one_of(st.just(0), st.integers(min_value=-3, max_value=3), st.none()),
)
@example(dtype="F8_E4M3", shape=[0, 2**64], begin=0, extra=0)  # a dimension past u64 beside a 0: no bytes
def test_plain_entries_accept_only_what_parse_entry_accepts_and_make_the_same_entry(dtype, shape, begin, extra):
    """The fast path for well-formed headers never widens what read_header accepts."""
    from ascendconv.io.safetensors import _parse_entry, _plain_entries

    size = None
    if isinstance(shape, list) and dtype in NUMPY_DTYPES and all(isinstance(d, int) for d in shape):
        size = NUMPY_DTYPES[dtype].itemsize * math.prod(shape)
    end = begin + size + (extra or 0) if isinstance(begin, int) and size is not None else begin
    info = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
    plain = _plain_entries(Path("x.safetensors"), {"t": info}, 64)
    try:
        full = _parse_entry(Path("x.safetensors"), "t", info, 64)
    except HeaderError:
        full = None
    assert plain is None or plain == ({"t": full}, end if begin == 0 else -1)
    assert plain is None or type(plain[0]["t"]) is TensorEntry  # a plain tuple of the fields would be equal
