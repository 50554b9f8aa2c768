"""The ``tbq`` command line.

Each sub-command lives in the module that owns its concern; that module
provides ``add_arguments(parser)`` and ``run_cli(args) -> int``. This file only
wires them together, importing each module when its command runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .. import __version__
from ..errors import TbqError

# command name -> (module, one-line help)
COMMANDS = {
    "compare": ("tbq.cli.compare", "encode/decode a KV data set with every format and print an error table"),
    "budget": ("tbq.cli.budget", "KV cache memory and bandwidth budget for a model geometry"),
    "golden": ("tbq.cli.golden", "write golden test vectors (inputs, bytes, decoded floats, fragility masks, C headers) for kernel tests"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tbq", description="Bit-exact KV-cache block quantization codecs.")
    parser.add_argument("--version", action="version", version=f"tbq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (modname, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=modname)
        importlib.import_module(modname).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(args._module)
    try:
        return int(module.run_cli(args) or 0)
    except TbqError as exc:
        print(f"tbq {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
