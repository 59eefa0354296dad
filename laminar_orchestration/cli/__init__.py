"""The `laminar` command line: one subcommand per operation, `--json` where output is data.

Every subcommand takes `--store URL` (default: ``LAMINAR_STORE``, else a local
store under the working directory). Errors are reported as one line,
``laminar: error: <what is wrong>``, with an exit code by the error's kind
(`laminar_orchestration.errors.EXIT_CODES`): 2 invalid input, 3 unavailable,
4 conflict, 5 fenced, 6 corrupt data, 7 not found, 1 any other failure (and
`verify` finding losses or duplicates).

Each subcommand is a `Command` (``base``) declaring its flags next to its
handler; what it prints goes through an `Output` (``output``): text for a
terminal, or JSON with ``--json``. The chaos suite is not a subcommand: it is
development tooling in the repository checkout (``python -m laminar_dev.chaos``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from laminar_orchestration.cli.base import Command
from laminar_orchestration.cli.cluster import Init, Status
from laminar_orchestration.cli.data import NodeRun, Produce, Query, Sweep, Verify
from laminar_orchestration.cli.migrations import Failover, Migrate, Rebalance
from laminar_orchestration.cli.output import output_for
from laminar_orchestration.cli.table import Table
from laminar_orchestration.cli.tools import Demo, Policies, Report
from laminar_orchestration.errors import LaminarError, exit_code
from laminar_orchestration.store import default_store_url

__all__ = ["COMMANDS", "build_parser", "main", "run"]

#: Every subcommand, in the order `laminar --help` lists them.
COMMANDS: tuple[Command, ...] = (
    Init(),
    Status(),
    NodeRun(),
    Produce(),
    Query(),
    Verify(),
    Migrate(),
    Failover(),
    Rebalance(),
    Sweep(),
    Table(),
    Demo(),
    Report(),
    Policies(),
)


def build_parser() -> argparse.ArgumentParser:
    """The `laminar` argument parser: one subparser per command of `COMMANDS`."""
    parser = argparse.ArgumentParser(prog="laminar", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `laminar` command `argv` (default: the process's arguments); the exit code."""
    args = build_parser().parse_args(argv)
    command: Command = args.command
    if getattr(args, "store", "unset") is None:
        args.store = default_store_url()
    try:
        return command.run(args, output_for(getattr(args, "json", False)))
    except LaminarError as exc:
        # One line whatever the message holds: scripts grep it, humans read it.
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"laminar: error: {message}", file=sys.stderr)
        return exit_code(exc.error_kind)
    except KeyboardInterrupt:
        if command.name == "init":
            print("laminar: interrupted: run the same `laminar init` again to complete it", file=sys.stderr)
        return 130


def run() -> NoReturn:
    """The `laminar` program: `main`, then exit with its code once the output is flushed.

    The process ends without the interpreter's teardown: native libraries' threads (pyarrow's
    allocator, RocksDB's, deltalake's runtime) may abort it there ("terminate called without an
    active exception", exit -6) after a command that succeeded. Every command has finished its
    work and stopped its own threads when `main` returns.
    """
    try:
        code = main()
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        code = 1  # the reader went away (`laminar status | head`): nothing more to say to it
    logging.shutdown()
    os._exit(code)
