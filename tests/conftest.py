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

pytest_plugins = ["pytester"]  # tests/test_markers.py runs the marker rule on small test files of its own

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


# ---------------------------------------------------------------------------
# Markers: ``integration`` and ``slow``, applied by rule at collection, so that
#
#     python -m pytest -m "not slow and not integration"
#
# is the fast subset for the edit-test loop (CONTRIBUTING.md says how long it takes).
#
# ``integration``: the test starts another process (``subprocess``, ``sys.executable``, a process pool, a
# fork), or needs the builds in ../shared. Found from the source: a test is integration when its function,
# a fixture it requests or a function of its module (or of tests/helpers.py) it calls, directly or through
# others, names one of :data:`SPAWN_NAMES` or a module constant built from the string "shared". Every test
# left unmarked runs under :func:`spawn_guard`, which fails it if it starts a process after all: the rule
# cannot silently miss one (tests/test_markers.py tests the guard).
#
# ``slow``: the modules and tests of :data:`SLOW`, each with its reason (measured with --durations).
# :data:`INTEGRATION` lists the few integration tests the source rule cannot see (a doctest's examples).
# ---------------------------------------------------------------------------

import ast  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
from pathlib import Path  # noqa: E402

TESTS = Path(__file__).resolve().parent

#: Names whose use means a process is started: subprocess and its functions, the interpreter's path handed
#: to one, process pools, multiprocessing, forks, Dask's local cluster of worker processes, a notebook's kernel,
#: and two packages' calls that start one.
SPAWN_NAMES = frozenset(
    {
        "subprocess",
        "Popen",
        "check_output",
        "check_call",
        "executable",
        "ProcessPoolExecutor",
        "multiprocessing",
        "get_context",
        "fork",
        "posix_spawn",
        "LocalCluster",
        "system",
        "nbclient",
        "jupytext",  # importing it runs `pandoc --version`
        "check_program",  # tbq.check's program target runs the command
    }
)

#: Slow tests (over a few seconds each on two loaded cores, or many seconds as a module), by node id prefix:
#: a module (``test_x.py``) or one test (``test_x.py::test_name``), with the reason.
SLOW: dict[str, str] = {
    "test_properties.py": "hypothesis properties of every format, dozens of examples each (the fuzz plan's home)",
    "test_strategies.py": "hypothesis draws of every strategy family, hundreds of examples",
    "test_hf_architectures.py": "builds and runs a transformers model of each architecture",
    "test_hf_model.py": "trains, loads and evaluates the shipped model",
    "test_hf_cache.py": "runs the shipped model with each cache format",
    "test_hf_turbo_vllm.py": "runs the shipped model with the turbo and vLLM caches",
    "test_dask.py": "starts Dask schedulers and clusters of threads",
    "test_golden.py": "generates and checks the golden vector sets",
    "test_memory.py": "measures peak memory of large encodes",
    "test_cli_eval.py": "runs tbq eval on the shipped model and the small architectures (minutes in all)",
    "test_format_vllm_turboquant.py::test_format_battery_at_other_head_dims": "compiles the kernels per head dim",
    "test_format_fp8.py::test_the_slow_model_agrees_on_hard_values": "the pure-Python model on every hard value",
    "test_cli_compare.py::test_compare_builtin_data_prints_every_format": "compares every format on the built-in data",
    "test_cli_compare.py::test_default_table_fits_100_columns_and_wide_has_every_column": "every format, twice",
    "test_attention.py::test_a_cache_whose_block_is_an_option_reads_its_own_sizes": "compiles a reader per size",
}

#: Integration tests the source rule cannot see, by the same kind of key, with the reason.
INTEGRATION: dict[str, str] = {
    "test_doctests.py::test_docstring_examples[tbq.check.sharedlib]": "its examples run a probe process",
    "test_doctests.py::test_docstring_examples[tbq.check.targets]": "its examples run a program target",
    "test_api.py::test_check_takes_any_case": "tbq check runs a program target",
    "test_check.py::test_a_dot_check_accepts_unsigned_codes_and_goes_on_to_the_next_failure": "a library probe process",
}


@functools.cache
def _module_graph(path: Path) -> tuple[dict[str, set[str]], set[str]]:
    """(names each module-level function, method and fixture of ``path`` refers to, by name; the names that are
    indicators in that module: :data:`SPAWN_NAMES` and module constants built from the string "shared")."""
    tree = ast.parse(path.read_text())
    refs: dict[str, set[str]] = {}
    indicators = set(SPAWN_NAMES)

    def names_in(node: ast.AST) -> set[str]:
        out = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                out.add(n.id)
            elif isinstance(n, ast.Attribute):
                out.add(n.attr)
            elif isinstance(n, ast.arg):
                out.add(n.arg)  # a test's or fixture's parameters: the fixtures it requests
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
                out.add(n.value)  # pytest.importorskip("nbclient"), getattr(mod, "fork")
        return out

    def shared_constant(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Constant) and n.value in ("shared", "../shared") for n in ast.walk(node))

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            refs[node.name] = names_in(node)
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    refs[f"{node.name}.{sub.name}"] = names_in(sub) | {node.name}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    refs[t.id] = names_in(node.value) if node.value is not None else set()
                    if node.value is not None and shared_constant(node.value):
                        indicators.add(t.id)
    return refs, indicators


def _spawns(path: Path, qualname: str) -> bool:
    """Whether the test ``qualname`` of module ``path`` reaches an indicator through the module's (and
    tests/helpers.py's, and conftest's fixtures') functions, fixtures and constants."""
    helpers = TESTS / "helpers.py"
    graphs = [_module_graph(path)] + ([_module_graph(helpers)] if helpers.is_file() else [])
    refs: dict[str, set[str]] = {}
    indicators: set[str] = set()
    for r, ind in reversed(graphs):  # the test module's own definitions win
        refs.update(r)
        indicators |= ind
    seen, todo = set(), [qualname]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        used = refs.get(name, set())
        if used & indicators:
            return True
        todo.extend(u for u in used if u in refs)
    return False


def _matches(key: str, rel: str, local: str) -> bool:
    """Whether a SLOW/INTEGRATION ``key`` names module ``rel`` or test ``local`` (``test_x.py::test_y[...]``)."""
    return key == rel or local == key or local.startswith((key + "[", key + "::"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        rel = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else path.name
        local = rel + item.nodeid[item.nodeid.index("::") :] if "::" in item.nodeid else rel
        fn = getattr(item, "function", None)
        if fn is not None and path.suffix == ".py":
            qual = fn.__qualname__ if "<locals>" not in fn.__qualname__ else fn.__name__
            if _spawns(path, qual):
                item.add_marker(pytest.mark.integration)
        if any(_matches(key, rel, local) for key in INTEGRATION):
            item.add_marker(pytest.mark.integration)
        for key, reason in SLOW.items():
            if _matches(key, rel, local):
                item.add_marker(pytest.mark.slow(reason=reason))


class SpawnedProcess(RuntimeError):
    """A test not marked ``integration`` started a process."""


@contextlib.contextmanager
def spawn_guard(what: str):
    """Within the block, starting a process raises :class:`SpawnedProcess` naming ``what``: subprocess and
    multiprocessing's spawns (``_posixsubprocess.fork_exec`` and subprocess's alias of it, ``os.posix_spawn``),
    ``os.fork``, ``os.system``."""
    import _posixsubprocess

    def refuse(name):
        def f(*args, **kwargs):
            raise SpawnedProcess(
                f"{what} started a process ({name}) but is not marked integration: tests/conftest.py's rule "
                "missed it (name the way it spawns in SPAWN_NAMES, or mark the test)"
            )

        return f

    import subprocess

    patches = [
        (_posixsubprocess, "fork_exec"),
        (subprocess, "_fork_exec"),  # subprocess's own alias of it (Python 3.11+)
        (os, "fork"),
        (os, "posix_spawn"),
        (os, "posix_spawnp"),
        (os, "system"),
    ]
    saved = [(mod, name, getattr(mod, name)) for mod, name in patches if hasattr(mod, name)]
    for mod, name, _ in saved:
        setattr(mod, name, refuse(f"{mod.__name__}.{name}"))
    try:
        yield
    finally:
        for mod, name, orig in saved:
            setattr(mod, name, orig)


@pytest.fixture(autouse=True)
def _no_process_unless_integration(request):
    """Every test left unmarked by the rule runs under :func:`spawn_guard`."""
    if request.node.get_closest_marker("integration") is not None:
        yield
        return
    with spawn_guard(request.node.nodeid):
        yield
