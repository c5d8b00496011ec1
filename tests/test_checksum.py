"""file_digest: the shard checksum read back by verify, resume and assemble.

It hashes a mapped file piece by piece while a second thread populates the pieces ahead and unmaps
those behind; these tests shrink the pieces to a few pages so that every boundary is crossed.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading

import blake3
import pytest

from ascendconv.io import checksum, files
from ascendconv.io.checksum import file_digest

PIECE = 4 * mmap.PAGESIZE


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(checksum, "HASH_PIECE", PIECE)
    monkeypatch.setattr(checksum, "READ_AHEAD", 2 * PIECE)


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


@pytest.mark.parametrize("size", [0, 1, PIECE - 1, PIECE, PIECE + 1, 5 * PIECE + PIECE // 2, 40 * PIECE])
@pytest.mark.parametrize("algorithm", ["blake3", "sha256"])
def test_digest_is_the_hash_of_the_bytes(tmp_path, small_pieces, size, algorithm):
    data = os.urandom(size)
    path = tmp_path / "shard.safetensors"
    path.write_bytes(data)
    want = blake3.blake3(data).hexdigest() if algorithm == "blake3" else hashlib.sha256(data).hexdigest()
    assert file_digest(path, algorithm) == want
    assert "ascendconv-read-ahead" not in _threads()  # the helper thread is joined, not left behind


def test_a_file_cut_short_while_hashed_is_an_oserror(tmp_path, small_pieces, monkeypatch):
    # Cut to 5 pieces once the first is hashed: the thread is at most two pieces ahead, so the pieces
    # already populated stay inside the file, and populating the sixth finds it gone.
    path = tmp_path / "shard.safetensors"
    path.write_bytes(os.urandom(20 * PIECE))
    real = checksum.new_hasher

    class Cutting:
        def __init__(self, algorithm):
            self.inner, self.cut = real(algorithm), False

        def update(self, data):
            self.inner.update(data)
            if not self.cut:
                os.truncate(path, 5 * PIECE)
                self.cut = True

        def hexdigest(self):
            return self.inner.hexdigest()

    monkeypatch.setattr(checksum, "new_hasher", Cutting)
    with pytest.raises(OSError, match="shrank while it was being read"):
        file_digest(path, "blake3")
    assert "ascendconv-read-ahead" not in _threads()


def test_an_error_in_the_read_ahead_thread_reaches_the_caller(tmp_path, small_pieces, monkeypatch):
    path = tmp_path / "shard.safetensors"
    path.write_bytes(os.urandom(10 * PIECE))
    calls = []
    real = files.populate

    def failing(mapped, start, count):
        calls.append(start)
        if len(calls) == 3:
            raise MemoryError("no pages")
        return real(mapped, start, count)

    monkeypatch.setattr(files, "populate", failing)
    with pytest.raises(MemoryError, match="no pages"):
        file_digest(path, "blake3")
    assert calls == [0, PIECE, 2 * PIECE]
    assert "ascendconv-read-ahead" not in _threads()


def test_the_caller_stopping_early_frees_the_thread(tmp_path, small_pieces, monkeypatch):
    # An exception in the hash (here a stand-in for Ctrl-C) ends the read-ahead thread, even one
    # blocked on handing over a piece, before the mapping it touches is closed.
    path = tmp_path / "shard.safetensors"
    path.write_bytes(os.urandom(30 * PIECE))

    class Interrupted:
        def __init__(self, algorithm):
            pass

        def update(self, data):
            raise KeyboardInterrupt

    monkeypatch.setattr(checksum, "new_hasher", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        file_digest(path, "blake3")
    assert "ascendconv-read-ahead" not in _threads()


def test_a_system_without_read_advice_hashes_the_same(tmp_path, small_pieces, monkeypatch):
    data = os.urandom(9 * PIECE + 7)
    path = tmp_path / "shard.safetensors"
    path.write_bytes(data)
    monkeypatch.delattr(os, "posix_fadvise")  # macOS
    assert file_digest(path, "blake3") == blake3.blake3(data).hexdigest()


def test_populate_tells_a_mapping_past_the_end(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"\1" * (4 * mmap.PAGESIZE))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert files.populate(mapped, 0, 4 * mmap.PAGESIZE)
        os.truncate(path, mmap.PAGESIZE)
        assert files.populate(mapped, 0, mmap.PAGESIZE)
        assert not files.populate(mapped, 2 * mmap.PAGESIZE, mmap.PAGESIZE)
