"""`validate_filename`: plain, safe names pass; paths, dot-files, odd characters do not."""

from __future__ import annotations

import unicodedata

import pytest

from sandbank.errors import BadRequest
from sandbank.files import validate_filename


@pytest.mark.parametrize(
    "name", ["data.csv", "Résumé (1).pdf", "数据.csv", "a+b=c,d@e_f-g.txt", "x" * 255]
)
def test_plain_names_are_accepted(name: str) -> None:
    assert validate_filename(name) == name


def test_names_come_back_in_nfc() -> None:
    decomposed = unicodedata.normalize("NFD", "Résumé.txt")
    assert validate_filename(decomposed) == "Résumé.txt"


@pytest.mark.parametrize(
    "name",
    [
        "", ".", "..", "../etc/passwd", "a/b", "a\\b", ".hidden", "-rf", "a..b",
        "a\x00b", "a\nb", "tab\there", " lead", "trail ", "x" * 256, "é" * 128,
        "a;b", "a*b", "$(x)", "a|b", "<a>", "a'b", 'a"b', "a:b",
    ],
)  # fmt: skip
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(BadRequest):
        validate_filename(name)
