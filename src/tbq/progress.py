"""Progress reports on stderr for long command-line work.

Reports go to stderr so that stdout stays parseable (``--json``), and only
when stderr is a terminal: piped or captured output stays clean. ``enabled``
overrides the terminal check (``--quiet`` passes ``False``).

>>> with Progress(3, "demo", enabled=False) as bar:
...     for name in ("a", "b", "c"):
...         bar.step(name)
>>> bar.done
3
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Literal, TextIO

__all__ = ["Progress", "slow_notice", "stderr_is_terminal"]


def stderr_is_terminal(stream: TextIO | None = None) -> bool:
    """True when ``stream`` (default ``sys.stderr``) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """A one-line counter ``desc: done/total label (elapsed)`` rewritten in place.

    ``enabled=None`` reports only when the stream is a terminal.
    """

    def __init__(self, total: int, desc: str, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = stderr_is_terminal(self.stream) if enabled is None else bool(enabled)
        self.total, self.desc, self.done = int(total), desc, 0
        self.t0 = time.perf_counter()
        self._width = 0

    def _write(self, text: str, end: str = "") -> None:
        if not self.enabled:
            return
        pad = " " * max(0, self._width - len(text))
        self.stream.write("\r" + text + pad + end)
        self.stream.flush()
        self._width = len(text)

    def step(self, label: str = "", n: int = 1) -> None:
        """Count ``n`` more units of work done; ``label`` names the last one."""
        self.done += n
        elapsed = time.perf_counter() - self.t0
        self._write(f"{self.desc}: {self.done}/{self.total} {label} ({elapsed:.1f} s)".replace("  ", " "))

    def close(self) -> None:
        """Erase the line (the caller prints its own result)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False


class slow_notice:
    """Context manager: print ``message`` to stderr if the body runs longer than ``after`` seconds.

    Used around work whose first run is slow for a reason the user should
    know (numba compiling kernels into its cache), so a silent pause never
    lasts more than ``after`` seconds. When the body ends after the message
    was shown, ``done`` (if given) is printed on the same line.

    >>> with slow_notice("compiling", after=10.0, enabled=True) as n:
    ...     pass
    >>> n.shown
    False
    """

    def __init__(
        self,
        message: str,
        after: float = 1.0,
        *,
        done: str = "done",
        enabled: bool | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.message, self.after, self.done_text = message, float(after), done
        self.stream = sys.stderr if stream is None else stream
        self.enabled = stderr_is_terminal(self.stream) if enabled is None else bool(enabled)
        self.shown = False
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._t0 = 0.0

    def _show(self) -> None:
        with self._lock:
            if self._timer is None:  # the body already finished
                return
            self.shown = True
            self.stream.write(self.message)
            self.stream.flush()

    def __enter__(self) -> slow_notice:
        self._t0 = time.perf_counter()
        if self.enabled:
            self._timer = threading.Timer(self.after, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        if self.shown:
            self.stream.write(f" {self.done_text} ({time.perf_counter() - self._t0:.1f} s)\n")
            self.stream.flush()
        return False
