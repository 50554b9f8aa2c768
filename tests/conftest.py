"""pytest configuration: hypothesis profiles.

Choose a profile with the environment variable ``TBQ_HYPOTHESIS_PROFILE``:

- ``default`` (CI): a few dozen examples per property, no deadline (numba
  compiles each kernel on its first call, which would trip any deadline).
- ``fuzz``: 100,000 examples per property, no deadline, every health check off,
  failing examples printed with a reproduction blob. For long runs::

      TBQ_HYPOTHESIS_PROFILE=fuzz python -m pytest tests/test_properties.py --hypothesis-show-statistics

- ``dev``: 10 examples, for quick edit-test loops.

A profile of more than 1,000 examples (``fuzz``, or ``benchmarks/run_fuzz.py
--examples N``) also freezes what survives each full garbage collection
(:func:`gc.freeze`): hypothesis keeps every example's choices in a tree that
grows for the whole run, and each full collection rescanned all of it (at
30,000 examples of the unpack property, 5.5 of its 56 s; frozen, 0.9 s, the
same peak memory). Frozen objects are still freed by reference counting; only
a reference cycle among them is never collected.
"""

from __future__ import annotations

import gc
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


def _freeze_after_full_collections(phase: str, info: dict[str, int]) -> None:
    """A gc callback: after a full (generation 2) collection, freeze the survivors (see the module docstring)."""
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


if settings is not None and settings().max_examples > 1000 and _freeze_after_full_collections not in gc.callbacks:
    gc.callbacks.append(_freeze_after_full_collections)


def pytest_report_header(config):
    if settings is None:
        return None
    return f"hypothesis profile: {os.environ.get(PROFILE_ENV, 'default')} (set {PROFILE_ENV}=fuzz for the long run)"
