"""Everything here runs in virtual time: a real sleep fails the test."""

import pytest


@pytest.fixture(autouse=True)
def _virtual_time_only(no_real_sleep: None) -> None:
    pass
