"""Ctrl-C: the command line stops with exit status 130, one line on stderr and no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tbq import cli

ARGV = ["budget", "--layers", "2", "--kv-heads", "2", "--head-dim", "128", "--contexts", "1K"]


def test_keyboard_interrupt_in_a_command_exits_130(monkeypatch, capsys):
    import tbq.cli.budget as command

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "run_cli", interrupted)
    assert cli.main(ARGV) == 130
    err = capsys.readouterr().err
    assert err.strip() == "tbq budget: interrupted" and "Traceback" not in err


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_real_sigint_exits_130_without_a_traceback():
    """SIGINT delivered to the process while a command runs (what Ctrl-C in a terminal sends)."""
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        import tbq.cli, tbq.cli.budget as command

        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # a background job inherits SIGINT ignored:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own handler, as in a terminal

        def run_cli(args):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)  # the signal interrupts this
            return 0

        command.run_cli = run_cli
        sys.exit(tbq.cli.main({ARGV!r}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    assert r.stderr.strip() == "tbq budget: interrupted"
    assert r.stdout == ""
