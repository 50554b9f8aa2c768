"""pytest configuration: hypothesis profiles.

Choose a profile with the environment variable ``TBQ_HYPOTHESIS_PROFILE``:

- ``default`` (CI): a few dozen examples per property, no deadline (numba
  compiles each kernel on its first call, which would trip any deadline).
- ``fuzz``: 100,000 examples per property, no deadline, every health check off,
  failing examples printed with a reproduction blob. For long runs::

      TBQ_HYPOTHESIS_PROFILE=fuzz python -m pytest tests/test_properties.py --hypothesis-show-statistics

- ``dev``: 10 examples, for quick edit-test loops.
"""

from __future__ import annotations

import os

import pytest

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - hypothesis is in the [test] extra
    settings = None

PROFILE_ENV = "TBQ_HYPOTHESIS_PROFILE"

if settings is not None:
    _slow_ok = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile(
        "default",
        max_examples=40,
        deadline=None,
        print_blob=True,
        suppress_health_check=_slow_ok,
    )
    settings.register_profile(
        "fuzz",
        max_examples=100_000,
        deadline=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
    settings.register_profile("dev", max_examples=10, deadline=None, suppress_health_check=_slow_ok)
    _profile = os.environ.get(PROFILE_ENV, "default")
    try:
        settings.load_profile(_profile)
    except Exception as exc:  # an unknown name: say which exist instead of a bare KeyError
        raise pytest.UsageError(
            f"{PROFILE_ENV}={_profile!r} is not a hypothesis profile; use default, fuzz or dev"
        ) from exc


def pytest_report_header(config):
    if settings is None:
        return None
    return f"hypothesis profile: {os.environ.get(PROFILE_ENV, 'default')} (set {PROFILE_ENV}=fuzz for the long run)"
