"""tbq.parallel: fork safety of the thread pool, chunk plans, and the groups' error handling."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tbq import parallel

SCRIPT = textwrap.dedent(
    """
    import multiprocessing, sys
    import numpy as np
    import tbq

    X = np.random.default_rng(0).standard_normal((8192, 8, 128)).astype(np.float32)

    def f(i):
        return int(tbq.quantize(X, "q8_0", threads=2).sum() % 1000003) + 0 * i

    if __name__ == "__main__":
        method = sys.argv[1]
        want = f(0)  # the parent runs a multi-threaded call first: its executor exists
        assert tbq.parallel._pool, "the parent's call did not use the thread pool"
        ctx = multiprocessing.get_context(method)
        with ctx.Pool(2) as pool:
            got = pool.map(f, range(4))
        assert got == [want] * 4, (got, want)
        print("ok", method)
    """
)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_children_work_after_the_parent_used_the_thread_pool(tmp_path, method):
    """The issue's reproduction: a fork child used to wait forever on the parent's thread-less executor."""
    if method not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip(f"no {method} start method on this platform")
    script = tmp_path / "fork_case.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        proc = subprocess.run(
            [sys.executable, str(script), method], capture_output=True, text=True, env=env, timeout=240
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"a {method} child hung on its first multi-threaded tbq call")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"ok {method}"


def test_a_lock_held_at_fork_is_free_in_the_child():
    lock = parallel.fork_safe_lock()
    with lock:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            ok = lock.acquire(timeout=5)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_child_builds_its_own_executor():
    parent = parallel.executor()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        child = parallel.executor()
        ok = child is not parent and child.submit(lambda: 41 + 1).result(timeout=5) == 42
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    assert parallel.executor() is parent  # the parent's is untouched


@pytest.mark.parametrize(
    "n, chunk, threads, min_chunk", [(0, 4, 1, 1), (10, 4, 1, 1), (10, 100, 3, 1), (10, 100, 3, 5), (7, 1, 8, 1)]
)
def test_plan_chunks_covers_the_range_in_order(n, chunk, threads, min_chunk):
    bounds = parallel.plan_chunks(n, chunk, threads, min_chunk)
    assert [s for s, _ in bounds] == list(range(0, n, bounds[0][1] - bounds[0][0] if bounds else 1))
    assert sum(e - s for s, e in bounds) == n and all(0 < e - s <= chunk for s, e in bounds)
    if threads > 1 and n >= threads * min_chunk:
        assert len(bounds) >= threads  # every thread gets work


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_run_chunks_returns_results_in_order_and_stops_each_group_at_its_first_error(threads):
    calls = []

    def fn(s, e):
        calls.append(s)
        return (s, "bad") if s in (6, 7) else None

    out = parallel.run_chunks(10, 1, threads, fn)
    first = next(r for r in out if r is not None)
    assert first == (6, "bad")
    assert 8 not in calls or threads > 1  # one thread stops at the first error


def test_run_groups_waits_for_every_worker_before_raising():
    done = np.zeros(4, bool)

    def run(ids):
        for i in ids:
            if i == 0:
                raise RuntimeError("first group fails")
            done[i] = True

    with pytest.raises(RuntimeError, match="first group"):
        parallel.run_groups(4, 4, run)
    assert done[1:].all()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_run_shared_runs_every_task_once(threads):
    count = np.zeros(50, int)
    parallel.run_shared(50, threads, lambda i: count.__setitem__(i, count[i] + 1))
    assert (count == 1).all()


def test_run_shared_lets_a_free_thread_take_the_next_task():
    """Task 0 waits until every other task ran: on two threads only a shared queue (not fixed contiguous groups,
    where task 0's thread would own tasks 0-4) lets the other thread run tasks 1-9 meanwhile."""
    import threading

    rest = threading.Event()
    ran = []

    def run(i):
        if i == 0:
            assert rest.wait(timeout=60), "the other thread never took tasks 1-9"
        else:
            ran.append(i)
            if len(ran) == 9:
                rest.set()

    parallel.run_shared(10, 2, run)
    assert sorted(ran) == list(range(1, 10))


def test_run_shared_raises_the_first_error_by_task_order_after_every_worker_stopped():
    import threading

    started = threading.Barrier(2, timeout=60)
    done = np.zeros(6, bool)

    def run(i):
        if i in (0, 1):
            started.wait()  # tasks 0 and 1 run at the same time, on both threads
            if i == 1:
                raise ValueError("task 1")
            raise KeyError("task 0")
        done[i] = True

    with pytest.raises(KeyError, match="task 0"):
        parallel.run_shared(6, 2, run)
    assert not done.any()  # no task started after an error
