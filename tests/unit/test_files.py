"""eos/files.write_file_atomically: the whole new content or the old, and a secret's mode
from its creation -- also over the leftover temp file of a crash, whose mode would stay."""
from __future__ import annotations

import os

from eos.files import write_file_atomically


def test_a_leftover_temp_file_neither_widens_the_mode_nor_stays(tmp_path):
    target = tmp_path / "secret.json"
    leftover = tmp_path / "secret.json.tmp"
    leftover.write_text("half written before a crash")
    os.chmod(leftover, 0o666)
    write_file_atomically(target, b"keys", mode=0o600)
    assert target.read_bytes() == b"keys" and target.stat().st_mode & 0o777 == 0o600
    assert not leftover.exists()
    write_file_atomically(target, b"new keys", mode=0o600)
    assert target.read_bytes() == b"new keys" and target.stat().st_mode & 0o777 == 0o600


def test_a_json_document_reads_back_and_another_version_is_refused(tmp_path):
    import pytest

    from eos.files import read_json_document, write_json_document
    path = tmp_path / "doc.json"
    write_json_document(path, 2, {"items": [1, 2]})
    assert read_json_document(path, 2) == {"version": 2, "items": [1, 2]}
    with pytest.raises(ValueError, match="version 2, expected 3"):
        read_json_document(path, 3)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected 2"):
        read_json_document(path, 2)
