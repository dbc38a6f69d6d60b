"""Compressed line inputs (`corpus.jsonl.gz`, `rows.csv.zst`), read as the text they hold.

A file is compressed when its last suffix (any case) names a codec in CODECS; pyarrow
decompresses it as it is read, a buffer at a time, never the whole file in memory. The suffix
under the codec's names the format (`a.jsonl.gz` is JSONL). Only formats that are a stream of
text take one (`Format.compressed`: Parquet compresses inside).

A compressed stream has no offset to enter it by: it is read from its start (a Ray block over
one is the whole file, executors/ray_blocks.py). It must end as its codec ends it: a stream cut
short (an interrupted download) or damaged is a DamagedStream, an InputDataError naming the
file, never a shorter file. The file's identity (io/identity.py) is its stored bytes.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import IO

from jobrunner.errors import InputDataError
from jobrunner.io.fs import open_file

CODECS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".lz4": "lz4"}  # pyarrow's stream codecs
# A codec's first bytes (zstd: a frame, or a skippable frame); a file without them, an empty one
# too, is not that codec's data.
MAGIC = {
    "gzip": (b"\x1f\x8b",),
    "zstd": (b"\x28\xb5\x2f\xfd", *(bytes([0x50 + k, 0x2A, 0x4D, 0x18]) for k in range(16))),
    "bz2": (b"BZh",),
    "lz4": (b"\x04\x22\x4d\x18",),
}
# Compressed files that are refused by name, never misread as text. .xz: Python's reader ignores
# data it cannot read after a whole stream, so a damaged second stream would pass as no rows.
NOT_READ = {".xz": "xz -d", ".zip": "unzip", ".snappy": "a snappy tool", ".7z": "7z x"}
COMPRESSED = (*CODECS, *NOT_READ)
TEST = {"gzip": "gzip -t", "zstd": "zstd -t", "bz2": "bzip2 -t", "lz4": "lz4 -t"}
BUFFER_BYTES = 1 << 20  # decompressed bytes a read takes at once


class DamagedStream(InputDataError):
    """A compressed input that is not whole: cut short, damaged, or not its codec's data."""


def _fix(file: str, name: str) -> str:
    return (
        f"the file is incomplete (an interrupted download or copy?) or damaged. Test it"
        f" ({TEST[name]} {Path(file).name}), fetch or compress it again, and run again"
    )


def codec(file: str) -> str | None:
    """The codec `file`'s last suffix names; None for a file that is not compressed. A
    compression we do not read is refused (InputDataError), naming the tool to undo it."""
    suffix = Path(file).suffix.lower()
    if suffix in NOT_READ:
        raise InputDataError(
            f"{file}: {suffix} files are not read (compressed inputs: {', '.join(CODECS)});"
            f" decompress it ({NOT_READ[suffix]}) or compress it as .gz or .zst, and run again"
        )
    return CODECS.get(suffix)


def full_suffix(file: str) -> str:
    """The suffix that says what `file` holds, a codec's with the one under it:
    `a.JSONL.GZ` -> `.jsonl.gz`, `a.csv` -> `.csv`."""
    suffix = Path(file).suffix.lower()
    return data_suffix(file) + suffix if suffix in CODECS else suffix


def data_suffix(file: str) -> str:
    """The suffix of the data, under a codec's: `a.jsonl.gz` -> `.jsonl`."""
    return Path(plain_name(file)).suffix.lower()


def plain_name(file: str) -> str:
    """The name of the file a compressed one holds: `2024/a.jsonl.gz` -> `2024/a.jsonl`."""
    suffix = Path(file).suffix
    return file[: -len(suffix)] if suffix.lower() in CODECS else file


def open_input(file: str) -> IO[bytes]:
    """`file`'s bytes, decompressed when it is compressed: a buffered binary stream that reads
    lines and blocks alike, not seekable when compressed."""
    name = codec(file)
    raw = open_file(file)
    if name is None:
        return raw
    try:
        head = raw.read(8)
        if not head.startswith(MAGIC[name]):
            got = f"it begins {head!r}" if head else "it is empty"
            raise DamagedStream(
                f"{file}: not {name} data ({got}); a file that is not compressed is named"
                f" without {Path(file).suffix}, else {_fix(file, name)}"
            )
        raw.seek(0)
        import pyarrow as pa

        stream = pa.CompressedInputStream(raw, name)
    except BaseException:
        raw.close()
        raise
    return io.BufferedReader(_Decompressed(file, name, stream, raw), BUFFER_BYTES)


class _Decompressed(io.RawIOBase):
    """A codec's stream as a raw file; its decoding errors are DamagedStream. Errors of the
    file under it (an OSError with an errno: a disk's, a store's) stay theirs."""

    def __init__(self, file: str, name: str, stream, raw: IO[bytes]) -> None:
        self.file, self.name, self.stream, self.raw = file, name, stream, raw

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        try:
            return self.stream.readinto(b)
        except OSError as e:
            if e.errno is not None:
                raise
            raise DamagedStream(
                f"{self.file}: the {self.name} data is cut short or damaged ({e}):"
                f" {_fix(self.file, self.name)}"
            ) from e

    def close(self) -> None:
        if not self.closed:
            self.stream.close()
            self.raw.close()
        super().close()
