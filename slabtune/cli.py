"""The ``slabtune`` command line: parses arguments, calls the library, prints.

Each command group lives in a module of :mod:`slabtune.commands` that exposes
``register(subparsers)``; the handler it sets as ``func`` returns the exit code.
Errors a user can cause (bad input, unreadable files, impossible topologies) print one line
``slabtune: error: ...`` and exit 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from slabtune import __version__
from slabtune.errors import SlabtuneError

#: Command modules under slabtune.commands, in the order --help lists them.
COMMAND_MODULES = (
    "main_job",
    "kernel",
    "guest",
    "sweep",
    "results",
    "tune",
    "pareto",
    "plot",
    "export",
    "validate",
    "simulate",
    "reproduce",
)

#: Exceptions from the libraries below the CLI that mean "bad input", not "bug".
_USER_ERRORS = (SlabtuneError, ValueError, FileNotFoundError, PermissionError, IsADirectoryError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slabtune",
        description="Sweep, tune and validate Linux SLUB slab policies with a vectorised JAX model.",
    )
    parser.add_argument("--version", action="version", version=f"slabtune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"slabtune.commands.{name}").register(sub)
    return parser


#: Exit status when the reader of our stdout went away (as if killed by SIGPIPE: 128 + 13).
EXIT_BROKEN_PIPE = 141


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv=None) -> int:
    """Run one command; ``slabtune ... | head`` ends quietly when ``head`` stops reading."""
    try:
        return _run(argv)
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


def _run(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except _USER_ERRORS as err:
        msg = str(err) or err.__class__.__name__
        if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)) and err.filename:
            msg = f"{err.filename}: {err.strerror}"
        print(f"slabtune: error: {msg.splitlines()[0] if msg else msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("slabtune: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
