"""Hostile weights headers, label files and zips, generated at test time: each small on disk, each
costly to a parser that trusts it. Used by tests/unit/test_hostile_inputs.py, test_cli.py,
tests/unit/test_zip_check.py and tests/app/test_dashboard_many.py, and by tools/benchmarks/hostile_uploads.py
(docs/performance/2026-11-25.md, "Hostile uploads").
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from pathlib import Path


def safetensors_from_header(header: bytes | str, data: bytes = b"") -> bytes:
    """A .safetensors file of exactly this JSON header (any text, valid or not) and data."""
    raw = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(raw)) + raw + data


def nested_json(depth: int) -> str:
    """`depth` arrays inside one another: json.loads recurses once per level (100,000 escapes as RecursionError)."""
    return "[" * depth + "]" * depth


def nested_header(depth: int) -> bytes:
    """A safetensors file whose one tensor's shape is nested `depth` levels deep."""
    return safetensors_from_header('{"x": {"dtype": "F32", "shape": ' + nested_json(depth) + ', "data_offsets": [0, 0]}}')


def overflowing_shape() -> bytes:
    """A safetensors file declaring a dimension of 1e400: a float infinity to json, an OverflowError to int()."""
    return safetensors_from_header('{"x": {"dtype": "F32", "shape": [1e400, 0], "data_offsets": [0, 0]}}')


def empty_tensors_header(count: int) -> bytes:
    """A safetensors file of `count` empty tensors: a valid header of about 60 bytes a tensor and no data
    (1.67 M of them: 99 MB, minutes to parse unless the header's size is capped first)."""
    entry = '"t%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}'
    return safetensors_from_header("{" + ",".join(entry % i for i in range(count)) + "}")


def sparse_safetensors(path: Path, header_bytes: int) -> Path:
    """A file whose length field claims a header of `header_bytes`, with that many bytes of file behind it, but
    sparse: nothing is written beyond the first 9 bytes, so a reader that trusts the field reads them all."""
    with path.open("wb") as f:
        f.write(struct.pack("<Q", header_bytes) + b"{")
        f.truncate(8 + header_bytes)
    return path


def nested_labels(depth: int) -> str:
    """A JSON label file nested `depth` levels deep."""
    return '{"label_names": ' + nested_json(depth) + "}"


# ----------------------------------------------------------------------------------------------
# Zips


def zip_of(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _eocd(entries: int, directory_size: int, directory_offset: int) -> bytes:
    return struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, min(entries, 0xFFFF), min(entries, 0xFFFF),
                       directory_size, directory_offset, 0)


def zip_claiming_entries(entries: int) -> bytes:
    """A one-member zip whose end record (zip64's above 65,535) declares `entries` entries over a directory
    of that many 46-byte entries: what zipfile would walk. A few hundred bytes."""
    real = zip_of({"a.png": b"x"})
    directory_offset = real.rfind(b"PK\x01\x02")
    body = real[:real.rfind(b"PK\x05\x06")]
    size = entries * 46
    if entries <= 0xFFFF:
        return body + _eocd(entries, size, directory_offset)
    record = len(body)
    zip64 = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, size, directory_offset)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, record, 1)
    return body + zip64 + locator + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF,
                                                0xFFFFFFFF, 0xFFFFFFFF, 0)


def _empty_members(entries: int) -> tuple[bytes, bytes]:
    """The local headers and the central directory of `entries` empty stored members (names of a few characters)."""
    local, central = io.BytesIO(), io.BytesIO()
    crc = zlib.crc32(b"")
    for i in range(entries):
        name = f"{i:x}".encode()
        offset = local.tell()
        local.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, 0, 0, len(name), 0) + name)
        central.write(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, crc, 0, 0, len(name), 0, 0, 0,
                                  0, 0, offset) + name)
    return local.getvalue(), central.getvalue()


def zip_of_many_entries(entries: int) -> bytes:
    """A real zip of `entries` empty stored members (names of a few characters): 500,000 are about 40 MB, what
    zipfile takes seconds and hundreds of MB to parse unless the count is refused first."""
    body, directory = _empty_members(entries)
    if entries <= 0xFFFF:
        return body + directory + _eocd(entries, len(directory), len(body))
    record = len(body) + len(directory)
    zip64 = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, len(directory), len(body))
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, record, 1)
    return body + directory + zip64 + locator + _eocd(0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)


def zip_with_duplicate(name: str, first: bytes, second: bytes) -> bytes:
    """A zip naming `name` twice (zipfile warns and writes it; a reader sees one of the two)."""
    import warnings

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Duplicate name"
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr(name, first)
            archive.writestr(name, second)
    return buffer.getvalue()


def zip_with_overlap(names: list[str], data: bytes) -> bytes:
    """A zip of one deflated member whose directory lists it under every name in `names`, all pointing at the same
    local header and compressed bytes: the overlapping-entries zip bomb (each inflates to `data` again)."""
    real = zip_of({names[0]: data})
    at = real.rfind(b"PK\x01\x02")
    end = real.rfind(b"PK\x05\x06")
    entry = real[at:end]
    name_length = struct.unpack_from("<H", entry, 28)[0]
    fixed, rest = entry[:46], entry[46 + name_length:]
    directory = b"".join(fixed[:28] + struct.pack("<H", len(n.encode())) + fixed[30:] + n.encode() + rest for n in names)
    return real[:at] + directory + _eocd(len(names), len(directory), at)


def zip_with_decoy_zip64_record(entries: int) -> bytes:
    """A real zip of `entries` empty members whose zip64 locator points at a decoy zip64 end record (one entry, a
    directory of 49 bytes) put before the directory, while the zip64 record just before the locator declares them all.
    CPython's zipfile ignores the locator's offset and reads the record before it, so a check that follows the
    locator sees one entry while zipfile parses all `entries`."""
    body, directory = _empty_members(entries)
    decoy = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, 49, len(body))
    real = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, len(directory),
                       len(body) + len(decoy))
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, len(body), 1)  # points at the decoy
    return body + decoy + directory + real + locator + _eocd(0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)


def zip_with_signature_in_end_record(entries: int) -> bytes:
    """A real zip of `entries` (at most 65,535) empty members whose end record's two disk numbers read `PK\\x05\\x06`
    (0x4B50 and 0x0605): zipfile takes the record at the file's last 22 bytes as it is (it has no comment) and
    checks no disk number there, while a check that looks for the record's signature from the end finds the one
    inside it, 18 bytes from the end, too short to be a record: it saw no record and let zipfile parse them all."""
    body, directory = _empty_members(entries)
    return body + directory + struct.pack("<4s4H2LH", b"PK\x05\x06", 0x4B50, 0x0605, entries, entries,
                                          len(directory), len(body), 0)
