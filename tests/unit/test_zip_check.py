"""The Many images page's zip check (dashboard.image_sets.check_zip_directory) reads the directory CPython's zipfile
will read, from the end records zipfile reads, and refuses in one sentence before zipfile parses anything: a zip
whose records would show another reader another directory included."""

from __future__ import annotations

import io
import struct
import zipfile

import pytest

from dashboard import image_sets
from dashboard.image_sets import SetError, declared_directory, zip_members
from tools.hostile import archives as hostile


@pytest.fixture
def no_parse(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("zipfile parsed the directory")

    monkeypatch.setattr(zipfile, "ZipFile", refuse)


def one_sentence(text: str) -> bool:
    return text.endswith(".") and ". " not in text.rstrip(".")


def test_a_zip64_locator_pointing_at_a_decoy_record_is_refused_before_parsing(no_parse):
    data = hostile.zip_with_decoy_zip64_record(2_000)
    with pytest.raises(SetError) as refused:
        zip_members("decoy.zip", data)
    assert str(refused.value) == "decoy.zip has a zip64 locator that points away from its zip64 end record, so it is refused."


def test_the_end_records_signature_inside_its_own_fields_is_refused_before_parsing(no_parse):
    data = hostile.zip_with_signature_in_end_record(2_000)
    with pytest.raises(SetError) as refused:
        zip_members("inner.zip", data)
    assert str(refused.value) == "inner.zip hides its end record's signature inside that record, so it is refused."
    assert one_sentence(str(refused.value))


@pytest.mark.parametrize("make", [hostile.zip_with_decoy_zip64_record, hostile.zip_with_signature_in_end_record])
def test_zipfile_would_have_parsed_every_entry_of_the_hostile_zips(make):
    """What the check guards against: zipfile reads the directory the hostile records hide."""
    assert len(zipfile.ZipFile(io.BytesIO(make(2_000))).infolist()) == 2_000


def test_the_record_zipfile_reads_is_the_one_counted(monkeypatch):
    """zipfile's two ways to find the end record: the last 22 bytes when they declare no comment, else the last
    signature in the final 64 KiB. A comment holding a second, innocent-looking record is what zipfile reads."""
    honest = hostile.zip_of({"a.png": b"x", "b.png": b"y"})
    at = honest.rfind(b"PK\x05\x06")
    entries, size = struct.unpack_from("<HL", honest, at + 10)
    assert declared_directory("z.zip", honest) == (2, size)
    fake = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 5_000, 5_000, 46 * 5_000, 0, 0)
    with_comment = honest[:at + 20] + struct.pack("<H", len(fake)) + fake  # a comment that is a record itself
    assert declared_directory("z.zip", with_comment) == (5_000, 46 * 5_000)
    with pytest.raises(SetError, match=r"has 5,000 entries"):
        image_sets.check_zip_directory("z.zip", with_comment)


def test_honest_zips_pass_and_unpack():
    small = hostile.zip_of({"0/a.png": b"x"})
    at, directory = small.rfind(b"PK\x05\x06"), small.rfind(b"PK\x01\x02")
    assert declared_directory("small.zip", small) == (1, at - directory)
    # zip64 end records as archivers write them: the zip64 record just before its locator, which points at it
    zip64 = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, at - directory, directory)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, at, 1)
    classic = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    data = small[:at] + zip64 + locator + classic
    assert declared_directory("z64.zip", data) == (1, at - directory)
    members, _ = zip_members("z64.zip", data)
    assert members == [("0/a.png", b"x")]
