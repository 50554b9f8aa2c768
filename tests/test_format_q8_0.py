"""q8_0: the shared format battery (tests/helpers.py), plus what is particular to q8_0."""

from helpers import check_format


def test_q8_0_passes_the_format_battery():
    check_format("q8_0")
