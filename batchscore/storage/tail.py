"""A file's end, fetched in one retried request, read as if it were the whole file.

A Parquet reader reads a footer as a few ranged reads at the end of the file. Over an object
store each read is a request that can fail transiently, and a reader deep in pyarrow cannot
retry it; so the end is fetched first (with the store's retries), and the reader is given this
file of the object's full size that holds only that end. Parquet keeps its footer in the last
bytes: ``<metadata><4-byte little-endian metadata length>PAR1``.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable

# pyarrow reads the last 64 KiB of a file at once, hoping the footer is within them
FIRST_READ = 64 * 1024


def footer_span(end: bytes) -> int:
    """How many bytes at the end of a Parquet file its footer takes (0 when ``end`` does not
    end like a Parquet file)."""
    if len(end) < 8 or end[-4:] != b"PAR1":
        return 0
    return struct.unpack("<I", end[-8:-4])[0] + 8


def fetch_end(size: int, tail: Callable[[int], bytes]) -> bytes:
    """The end of a file of ``size`` bytes that a Parquet reader reads, from ``tail(count)``
    (the file's last ``count`` bytes): what pyarrow reads first, and the whole footer."""
    end = tail(min(size, FIRST_READ))
    needed = footer_span(end)
    return tail(min(size, needed)) if needed > len(end) else end


class TailFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only the last ``len(end)`` are held: reading
    before them is an `OSError` (nothing a footer reader does)."""

    def __init__(self, end: bytes, size: int) -> None:
        super().__init__()
        self.end, self.size, self.start, self.pos = end, size, size - len(end), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer: bytearray | memoryview) -> int:
        if self.pos >= self.size:
            return 0
        if self.pos < self.start:
            raise OSError(f"bytes {self.pos:,}-{self.start:,} were not fetched, only the end")
        chunk = self.end[self.pos - self.start : self.pos - self.start + len(buffer)]
        buffer[: len(chunk)] = chunk
        self.pos += len(chunk)
        return len(chunk)
