"""TBQ4_0 and TBQ3_0: the shared format battery with each codebook and seeded signs."""

import pytest
from helpers import check_format


@pytest.mark.parametrize("fmt", ["tbq4_0", "tbq3_0"])
@pytest.mark.parametrize(
    "options", [{}, {"codebook": "turboq-mtp"}, {"signs": 12345}], ids=["lloyd-max", "turboq-mtp", "seeded-signs"]
)
def test_tbq_passes_the_format_battery(fmt, options):
    check_format(fmt, **options)
