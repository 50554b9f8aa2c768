"""Threads and memory for tbq's work: the default thread count, the shared executor, chunk plans, the memory check.

Every multi-threaded call of tbq (the codecs' chunks, the fused attention
kernel's tasks) runs here. The process-global state (the executor and its
lock, and any lock another module registers with :func:`fork_safe_lock`) is
rebuilt in a child made by ``os.fork`` (``multiprocessing``'s ``fork`` start
method, PyTorch's DataLoader workers): the child inherits the parent's
executor *object* but none of its threads, so a job handed to it would wait
forever. After a fork the child starts with no executor and builds its own
on first use; ``spawn`` and ``forkserver`` children import tbq afresh anyway.

>>> run_chunks(10, 4, 1, lambda s, e: None)
[None, None, None]
>>> plan_chunks(10, 4, 1)
[(0, 4), (4, 8), (8, 10)]
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .errors import MemoryLimitError

__all__ = [
    "default_threads",
    "executor",
    "plan_chunks",
    "run_chunks",
    "run_groups",
    "run_shared",
    "fork_safe_lock",
    "after_fork_in_child",
    "memory_available",
    "require_memory",
]


def default_threads() -> int:
    """The threads tbq uses when a call says ``threads=None``: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


_after_fork: list[Callable[[], None]] = []


def after_fork_in_child(fn: Callable[[], None]) -> Callable[[], None]:
    """Call ``fn()`` in the child of every later ``os.fork`` (used to rebuild process-global state); returns ``fn``."""
    _after_fork.append(fn)
    return fn


def _run_after_fork() -> None:
    for fn in _after_fork:
        fn()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_run_after_fork)


class _ForkSafeLock:
    """A ``threading.Lock`` that is a new, unlocked lock in a forked child.

    A lock held by another thread at the moment of a fork stays held forever
    in the child (that thread does not exist there); this one is replaced.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        after_fork_in_child(self._renew)

    def _renew(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> _ForkSafeLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()


def fork_safe_lock() -> _ForkSafeLock:
    """A lock (a context manager) that is rebuilt, unlocked, in a forked child."""
    return _ForkSafeLock()


_pool_lock = fork_safe_lock()
_pool: dict[int, ThreadPoolExecutor] = {}  # pid -> executor: a forked child never finds its parent's


@after_fork_in_child
def _forget_pool() -> None:
    _pool.clear()  # the parent's executor has no threads here; do not shut it down (that would wait on them)


def executor() -> ThreadPoolExecutor:
    """The process's shared thread pool (``2 * default_threads()`` workers, at least 2), built on first use."""
    pid = os.getpid()
    with _pool_lock:
        ex = _pool.get(pid)
        if ex is None:
            _pool.clear()
            ex = _pool[pid] = ThreadPoolExecutor(max_workers=max(2, 2 * default_threads()), thread_name_prefix="tbq")
        return ex


def plan_chunks(n_items: int, chunk: int, threads: int, min_chunk: int = 1) -> list[tuple[int, int]]:
    """The ``(start, stop)`` chunks of ``[0, n_items)``: at most ``chunk`` items each.

    With several threads, a mid-sized range is split so that every thread gets
    work, but no chunk is made smaller than ``min_chunk`` items.
    """
    chunk = max(1, int(chunk))
    if threads > 1:
        chunk = min(chunk, max(min_chunk, -(-n_items // threads)))
    return [(s, min(s + chunk, n_items)) for s in range(0, n_items, chunk)]


def _split(n: int, parts: int) -> list[range]:
    """``range(n)`` in ``parts`` contiguous groups of near-equal size (the first groups one larger)."""
    q, r = divmod(n, parts)
    out: list[range] = []
    s = 0
    for i in range(parts):
        e = s + q + (1 if i < r else 0)
        out.append(range(s, e))
        s = e
    return out


def run_groups(n_tasks: int, threads: int, run: Callable[[Sequence[int]], None]) -> None:
    """Call ``run(ids)`` on ``min(threads, n_tasks)`` contiguous groups of ``range(n_tasks)``.

    The first group runs on the calling thread, the others on :func:`executor`;
    this returns (or raises the first error) only when every group finished.
    """
    if n_tasks <= 0:
        return
    groups = _split(n_tasks, max(1, min(threads, n_tasks)))
    futures = [executor().submit(run, g) for g in groups[1:]]
    try:
        run(groups[0])
    finally:  # never return (or raise) while workers still write into the output
        concurrent.futures.wait(futures)
    for f in futures:
        f.result()


def run_shared(n_tasks: int, threads: int, run: Callable[[int], None]) -> None:
    """Call ``run(i)`` for every ``i`` in ``range(n_tasks)``, on ``min(threads, n_tasks)`` threads taking the next task.

    Unlike :func:`run_groups`' fixed contiguous groups, a thread that finishes
    early takes the next task, so a core slowed by another process (a shared
    machine) does not hold back the whole call. Which thread runs a task must
    not matter: each task writes its own output (the caller merges them in
    task order). The calling thread is one of the workers; this returns (or
    raises the first error by task order) only when every worker finished, and
    after an error no further task is started.

    >>> seen = []
    >>> run_shared(5, 2, seen.append)
    >>> sorted(seen)
    [0, 1, 2, 3, 4]
    """
    if n_tasks <= 0:
        return
    lock = threading.Lock()
    state = {"next": 0}
    errors: dict[int, BaseException] = {}

    def worker() -> None:
        while True:
            with lock:
                i = state["next"]
                if i >= n_tasks or errors:
                    return
                state["next"] = i + 1
            try:
                run(i)
            except BaseException as e:  # re-raised below, in the caller's thread
                with lock:
                    errors[i] = e
                return

    n = max(1, min(threads, n_tasks))
    futures = [executor().submit(worker) for _ in range(n - 1)]
    try:
        worker()
    finally:  # never return (or raise) while workers still write into the output
        concurrent.futures.wait(futures)
    for f in futures:
        f.result()
    if errors:
        raise errors[min(errors)]


def run_chunks(n_items: int, chunk: int, threads: int, fn: Callable[[int, int], Any], min_chunk: int = 1) -> list[Any]:
    """Call ``fn(start, stop)`` over ``[0, n_items)`` in chunks (:func:`plan_chunks`); ``threads`` contiguous groups.

    Returns the results in chunk order. Each group runs its chunks in order and
    stops at its first non-None result, so the first error (by position) is
    the first non-None result.
    """
    bounds = plan_chunks(n_items, chunk, threads, min_chunk)
    if threads <= 1 or len(bounds) <= 1:
        results: list[Any] = []
        for s, e in bounds:
            r = fn(s, e)
            results.append(r)
            if r is not None:
                break
        return results
    groups = _split(len(bounds), min(threads, len(bounds)))
    outs: list[list[Any]] = [[] for _ in groups]

    def run(ids: Sequence[int]) -> None:
        for g in ids:
            out: list[Any] = []
            for i in groups[g]:
                r = fn(*bounds[i])
                out.append(r)
                if r is not None:
                    break
            outs[g] = out

    run_groups(len(groups), len(groups), run)
    return [r for out in outs for r in out]


# ---------------------------------------------------------------------------
# Memory: work whose size is known is refused before it starts if it cannot fit
# ---------------------------------------------------------------------------


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def memory_available() -> int | None:
    """Bytes this process can still allocate: the kernel's ``MemAvailable``, less under a cgroup limit; None if unknown.

    >>> m = memory_available(); m is None or m > 0
    True
    """
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        avail = None
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        room = max(0, limit - used)
        avail = room if avail is None else min(avail, room)
    return avail


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def require_memory(needed: int, what: str) -> None:
    """Raise :class:`~tbq.errors.MemoryLimitError` when ``needed`` bytes exceed :func:`memory_available`.

    ``what`` names the work and the setting that decides its size, e.g.
    ``"--rows-per-family 100000000"``. Nothing happens when the available
    memory is unknown (not on Linux).

    >>> require_memory(1, "one byte")
    >>> require_memory(2**70, "a zebibyte")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tbq.errors.MemoryLimitError: a zebibyte needs about ... of memory, and ... are available; ...
    """
    needed = int(needed)
    avail = memory_available()
    if avail is not None and needed > avail:
        raise MemoryLimitError(
            f"{what} needs about {_gib(needed)} of memory, and {_gib(avail)} are available; "
            "nothing was computed or written: ask for less",
            needed=needed,
            available=avail,
        )
