"""The ``slow``/``integration`` markers of tests/conftest.py: the rule that applies them, and the guard that
fails a test left unmarked which starts a process anyway (so the fast subset ``-m "not slow and not
integration"`` never starts one, and a test the rule misses is reported, not silently kept in it)."""

from __future__ import annotations

import os
from pathlib import Path

import conftest
import pytest

TESTS = Path(__file__).resolve().parent
CONFTEST = (TESTS / "conftest.py").read_text()

_FILE = """
import os, subprocess, sys

import pytest

SHARED_DIR = os.path.join("..", "shared", "ggml")


def _child():
    return subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout


@pytest.fixture
def child_output():
    return _child()


def test_spawns_directly():
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True).returncode == 0


def test_spawns_through_a_helper():
    assert _child().strip() == "1"


def test_spawns_through_a_fixture(child_output):
    assert child_output.strip() == "1"


def test_needs_shared():
    assert SHARED_DIR


def test_pure():
    assert sum(range(4)) == 6


def test_spawns_where_the_rule_cannot_see():
    getattr(__import__("o" + "s"), "sy" + "stem")("true")
"""


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sample=_FILE)
    return pytester


#: The inner runs' options: no cache files, and no pytest-benchmark where installed (it asks git for the project's
#: name with a subprocess, inside the outer test's guard).
_OPTS = ("-p", "no:cacheprovider", "-p", "no:benchmark")


def _ids(result) -> set[str]:
    return {line.split("::")[1] for line in result.outlines if line.startswith("test_sample.py::")}


def test_the_rule_marks_every_test_that_starts_a_process_or_needs_shared(suite):
    """Directly, through a module function, through a fixture, or by a module constant of the ../shared path:
    each is ``integration``; the pure test is not."""
    got = _ids(suite.runpytest("-m", "integration", "--collect-only", "-q", *_OPTS))
    assert got == {
        "test_spawns_directly",
        "test_spawns_through_a_helper",
        "test_spawns_through_a_fixture",
        "test_needs_shared",
    }
    fast = _ids(suite.runpytest("-m", "not slow and not integration", "--collect-only", "-q", *_OPTS))
    assert fast == {"test_pure", "test_spawns_where_the_rule_cannot_see"}


def test_an_unmarked_test_that_starts_a_process_fails_with_the_reason(suite):
    """The one spawn the rule cannot see (a name built at run time) fails its test, naming the marker."""
    result = suite.runpytest("-m", "not integration", *_OPTS, "-k", "pure or cannot_see")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_spawns_where_the_rule_cannot_see*not marked integration*"])


def test_the_guard_refuses_every_way_to_start_a_process():
    """subprocess (fork_exec), os.fork, os.posix_spawn and os.system each raise inside the guard, before any
    process exists; multiprocessing and process pools start theirs through the same calls."""
    attempts = {
        "fork_exec": lambda: __import__("subprocess").run(["true"]),
        "posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], {}),
        "fork": lambda: os.fork(),
        "system": lambda: os.system("true"),
        "multiprocessing": lambda: __import__("multiprocessing").get_context("spawn").Process(target=print).start(),
    }
    for what, attempt in attempts.items():
        with conftest.spawn_guard("probe"), pytest.raises(conftest.SpawnedProcess, match="not marked integration"):
            attempt()
        assert what


def test_the_rule_on_the_suite_itself():
    """Spot checks on this suite's own tests: the package test (a fixture builds a venv), the CPU-path children,
    the ../shared ggml tests are integration; a format battery and the architecture checks are not."""
    assert conftest._spawns(TESTS / "test_package.py", "test_installed_wheel_runs_tbq_compare")
    assert conftest._spawns(
        TESTS / "test_numba_cache.py", "test_tbq_kernels_are_recompiled_after_a_shared_helper_is_edited"
    )
    assert conftest._spawns(
        TESTS / "test_format_tbq.py", "test_the_encoders_index_step_matches_the_specification_on_every_cpu_path"
    )
    assert conftest._spawns(
        TESTS / "test_check.py", "test_real_ggml_cpu_library_provenance_simd_q8_0_tie_rule_and_dot_products"
    )
    assert not conftest._spawns(TESTS / "test_format_q4_0.py", "test_q4_0_passes_the_format_battery")
    assert not conftest._spawns(TESTS / "test_architecture.py", "test_imports_run_down_the_layers")


def test_every_listed_entry_names_a_test_module_and_a_reason():
    """A stale SLOW entry (a module renamed or removed) would silently stop marking anything."""
    for key, reason in {**conftest.SLOW, **conftest.INTEGRATION}.items():
        path = TESTS / key.split("::")[0]
        assert path.is_file() and path.name.startswith("test_"), key
        assert len(reason.split()) >= 3, key
