"""The ``tbq`` command line.

Each sub-command lives in the module that owns its concern; that module
provides ``add_arguments(parser)`` and ``run_cli(args) -> int``. This file only
wires them together, importing each module when its command runs, and turns
the failures a user can cause into one line on stderr and exit status 2:

- bad arguments (argparse; the message says ``see tbq COMMAND --help``),
- :class:`~tbq.errors.TbqError` raised by the library or the command,
- :class:`OSError` (a file that cannot be read or written).

Anything else is a bug and keeps its traceback. Ctrl-C exits with status 130
and no traceback. The helpers below (argument types, output-path checks) are
shared by the command modules.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from .. import __version__
from ..errors import ConfigError, TbqError, TbqValueError

# command name -> (module, one-line help)
COMMANDS = {
    "compare": ("tbq.cli.compare", "encode/decode a KV data set with every format and print an error table"),
    "budget": ("tbq.cli.budget", "KV cache memory and bandwidth budget for a model geometry"),
    "golden": (
        "tbq.cli.golden",
        "write golden test vectors (inputs, bytes, decoded floats, fragility masks, C headers) for kernel tests",
    ),
    "eval": (
        "tbq.cli.eval",
        "a model's predictions with its KV cache in tbq formats: perplexity, KL, top-1, greedy, per layer",
    ),
    "check": (
        "tbq.cli.check",
        "check a kernel (shared library, program) against tbq: exact, fragile or wrong, with a diagnosis",
    ),
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: ``tbq compare: error: ... (see tbq compare --help)``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _parse_optional(self, arg_string: str) -> Any:
        # ``--contexts -8K``, ``--workspace -1GiB``, ``--vram -inf``: a value that starts with '-' but is
        # no option of this parser is the option's value (argparse alone only takes plain negative
        # numbers such as -5), so the flag's own parser says what is wrong with it.
        if (
            len(arg_string) > 1
            and arg_string[0] == "-"
            and arg_string[1] != "-"
            and not any(arg_string.startswith(o) for o in self._option_string_actions if not o.startswith("--"))
            and _VALUE_LIKE.match(arg_string)
        ):
            return None
        return super()._parse_optional(arg_string)


#: What a negative or special number looks like: ``-8K``, ``-1GiB``, ``-5GB/s``, ``-inf``, ``-nan``, ``-.5``.
_VALUE_LIKE = re.compile(r"^-(?:[\d.]|inf|nan)", re.IGNORECASE)


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already mentions a default.

    Options without a meaningful default (``None``, ``False``) are left alone.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        help_ = action.help or ""
        if "default" in help_ or action.default is None or action.default is False or not action.option_strings:
            return help_
        if action.default == argparse.SUPPRESS or (isinstance(action.default, (list, tuple)) and not action.default):
            return help_
        return help_ + " (default: %(default)s)"


#: The largest integer any flag takes unless it says otherwise (a signed 64-bit integer).
MAX_INT = 2**63 - 1


def int_at_least(minimum: int, maximum: int = MAX_INT) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[minimum, maximum]``, else a one-line usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", "")) if len(text) <= 40 else None
        except ValueError:
            value = None
        if value is None:
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise argparse.ArgumentTypeError(f"expected an integer, got {shown!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:,}, got {value:,}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def float_at_least(minimum: float, what: str = "a number") -> Callable[[str], float]:
    """An argparse ``type``: a finite number >= ``minimum`` (NaN, inf and non-numbers are one-line errors)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, got {text}")
        return value

    parse.__name__ = f"number >= {minimum}"
    return parse


def table_spec(value: str | None, what: str) -> Any:
    """``--codebook`` / ``--signs`` (``what``): a name, an integer seed (signs only), or a JSON file with exact
    tables; ``None`` (the flag not given) stays ``None``."""
    if value is None:
        return None
    if value.lstrip("-").isdigit():
        if what == "signs":
            return int(value)
        raise ConfigError(f"--codebook takes a name or a JSON file, got {value!r}")
    p = Path(value)
    if value.endswith(".json") or p.exists():
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read --{what} file {value}: {exc}") from None
    return value


def check_output_file(path: str, flag: str) -> Path:
    """Check, before any work, that ``path`` can be written as a file; return it as a Path.

    Missing parent directories are fine (they are created when the file is
    written), but the nearest existing ancestor must be a writable directory,
    and ``path`` must not be a directory or a read-only file.
    """
    p = Path(path)
    if not str(path).strip():
        raise TbqValueError(f"{flag}: the file name is empty")
    if p.is_dir():
        raise TbqValueError(f"{flag} {path}: is a directory; give a file name, e.g. {p / 'figure.png'}")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise TbqValueError(f"{flag} {path}: the file exists and is not writable")
        return p
    ancestor = p.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise TbqValueError(f"{flag} {path}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise TbqValueError(f"{flag} {path}: cannot create files in {ancestor} (permission denied)")
    return p


def check_figure_file(path: str, flag: str) -> Path:
    """:func:`check_output_file` plus: matplotlib is installed and can write the file's extension."""
    from ..plots import require_matplotlib

    p = check_output_file(path, flag)
    require_matplotlib(flag)
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    ext = p.suffix[1:].lower()
    if ext and ext not in kinds:
        raise TbqValueError(
            f"{flag} {path}: matplotlib cannot write .{ext} files; use one of .{', .'.join(sorted(kinds))}"
        )
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="tbq", description="Bit-exact KV-cache block quantization codecs.")
    parser.add_argument("--version", action="version", version=f"tbq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (modname, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=HelpFormatter)
        p.set_defaults(_module=modname, _parser=p)
        importlib.import_module(modname).add_arguments(p)
    return parser


def _oserror_message(exc: OSError) -> str:
    if exc.strerror and exc.filename is not None:
        names = str(exc.filename) + (f" -> {exc.filename2}" if exc.filename2 is not None else "")
        return f"{names}: {exc.strerror}"
    return " ".join(str(exc).split())


def main(argv: list[str] | None = None) -> int:
    """Run ``tbq`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status (0 ok, 2 error)."""
    parser = build_parser()
    try:  # usage errors, --help and --version end in SystemExit: return its status instead
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the sub-command's parser, so the message names it
            (getattr(args, "_parser", None) or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if args.command is None:
        print(f"tbq: error: give a command: {', '.join(COMMANDS)} (see tbq --help)", file=sys.stderr)
        return 2
    prog = f"tbq {args.command}"
    module = importlib.import_module(args._module)
    try:
        return int(module.run_cli(args) or 0)
    except TbqError as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        return 0
    except OSError as exc:  # a file that cannot be read or written: the user's to fix, not a bug
        print(f"{prog}: error: {_oserror_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
