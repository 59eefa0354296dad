"""A `laminar` subcommand: its arguments and its handler side by side, and the checks they share.

Each subcommand is a `Command` subclass: `add_arguments` declares its flags,
`run` checks them (before anything is read or written), calls the library
and hands the result to an `Output`. ``--store`` and ``--json`` are added by
the base class, so every command spells them the same way.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import ClassVar

from pydantic import ValidationError

from laminar_orchestration.cli.output import Output
from laminar_orchestration.errors import InvalidArgument
from laminar_orchestration.identity import UNASSIGNED
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import MigrationConfig
from laminar_orchestration.store import open_store

__all__ = [
    "Command",
    "add_migration_limits",
    "check_at_least",
    "check_node_id",
    "check_partition",
    "migration_config",
    "open_ledger",
    "parse_partition_list",
    "parse_weights",
]

STORE_HELP = "store URL: file:///path or s3://bucket/prefix (default: $LAMINAR_STORE, else ./.laminar/store)"


class Command:
    """One subcommand: `name`, `help`, its own flags (`add_arguments`) and its handler (`run`)."""

    name: ClassVar[str]
    help: ClassVar[str]
    #: True when the command's output is data: it takes ``--json``.
    json_output: ClassVar[bool] = False
    #: False for commands that must not default to the shared store (they make their own).
    shared_store: ClassVar[bool] = True
    #: A group's subcommands, name -> help (``laminar NAME SUBCOMMAND``, the one chosen in
    #: ``args.NAME_command``); empty for a command without any.
    subcommands: ClassVar[Mapping[str, str]] = {}

    def register(self, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """Add the subcommand (or each of its `subcommands`), its common flags and its own to `sub`."""
        parser = sub.add_parser(self.name, help=self.help, description=self.help)
        if not self.subcommands:
            self._add_flags(parser)
            return
        group = parser.add_subparsers(
            dest=f"{self.name}_command", required=True, metavar=f"{self.name.upper()}_COMMAND"
        )
        for name, text in self.subcommands.items():
            subparser = group.add_parser(name, help=text, description=text)
            self._add_flags(subparser)
            self.add_subcommand_arguments(name, subparser)

    def _add_flags(self, parser: argparse.ArgumentParser) -> None:
        if self.shared_store:
            parser.add_argument("--store", default=None, help=STORE_HELP)
        if self.json_output:
            parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
        self.add_arguments(parser)
        parser.set_defaults(command=self)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare the command's own flags (a group's: those every subcommand takes)."""

    def add_subcommand_arguments(self, subcommand: str, parser: argparse.ArgumentParser) -> None:
        """Declare the flags only `subcommand` of a group takes."""

    def run(self, args: argparse.Namespace, out: Output) -> int:
        """Carry the command out; the exit code."""
        raise NotImplementedError


# --- argument checks: before anything is read or written ----------------------------


def open_ledger(args: argparse.Namespace, *, create: bool = False) -> Ledger:
    """The ledger of ``--store``."""
    return Ledger(open_store(args.store, create=create))


def check_at_least(flag: str, value: float | None, low: float) -> None:
    """InvalidArgument naming `flag` when `value` is below `low` (None passes: the flag was not given)."""
    if value is not None and value < low:
        raise InvalidArgument(flag, f"{value} is below the minimum of {low}")


def check_node_id(flag: str, node: int | None) -> None:
    """InvalidArgument naming `flag` unless `node` is a node id (>= 1); None passes."""
    if node is None:
        return
    if node == UNASSIGNED:
        raise InvalidArgument(flag, "node 0 is the 'unassigned' sentinel, not a node (node ids are >= 1)")
    if node < 1:
        raise InvalidArgument(flag, f"{node} is not a node id (node ids are >= 1)")


def check_partition(ledger: Ledger, flag: str, partition: int) -> None:
    """InvalidArgument naming `flag` unless the cluster has `partition`."""
    count = ledger.cluster().partitions
    if not 0 <= partition < count:
        raise InvalidArgument(flag, f"partition {partition} does not exist (the cluster has partitions 0..{count - 1})")


def parse_partition_list(flag: str, text: str) -> tuple[int, ...]:
    """``"0,2,3"`` -> (0, 2, 3); an empty string is no partition."""
    parts = [t.strip() for t in text.split(",") if t.strip()]
    try:
        values = tuple(int(t) for t in parts)
    except ValueError:
        raise InvalidArgument(flag, f"{text!r} is not a comma-separated list of partition numbers") from None
    for v in values:
        if v < 0:
            raise InvalidArgument(flag, f"partition {v} is negative")
    return values


def parse_weights(items: Sequence[str]) -> dict[int, float]:
    """``["3=2.0"]`` -> {3: 2.0}; InvalidArgument naming ``--weight`` otherwise."""
    weights = {}
    for item in items:
        node, sep, weight = item.partition("=")
        try:
            if not sep:
                raise ValueError
            weights[int(node)] = float(weight)
        except ValueError:
            raise InvalidArgument("--weight", f"{item!r}: expected NODE=WEIGHT, e.g. 3=2.0") from None
    return weights


def add_migration_limits(parser: argparse.ArgumentParser, *, concurrency: str | None = None) -> None:
    """The timeouts of a migration (and, for commands moving many partitions, the per-node limit: the
    `MigrationConfig` field named by `concurrency`)."""
    parser.add_argument("--migration-timeout", type=float, help="seconds for a whole migration (default 30)")
    parser.add_argument("--release-wait-timeout", type=float, help="seconds per old-owner phase (default 15)")
    parser.add_argument("--transfer-timeout", type=float, help="seconds per new-owner phase (default 30)")
    if concurrency is not None:
        default = MigrationConfig.model_fields[concurrency].default
        parser.add_argument("--max-concurrent", type=int, help=f"migrations at once per node (default {default})")
        parser.set_defaults(concurrency_field=concurrency)


def migration_config(args: argparse.Namespace) -> MigrationConfig:
    """The `MigrationConfig` of the flags `add_migration_limits` declared; each must be > 0."""
    flags = {
        "migration_timeout_s": ("--migration-timeout", args.migration_timeout),
        "release_wait_timeout_s": ("--release-wait-timeout", args.release_wait_timeout),
        "checkpoint_transfer_timeout_s": ("--transfer-timeout", args.transfer_timeout),
        getattr(args, "concurrency_field", "max_concurrent_migrations"): (
            "--max-concurrent",
            getattr(args, "max_concurrent", None),
        ),
    }
    for flag, value in flags.values():
        if value is not None and not value > 0:
            raise InvalidArgument(flag, f"{value} must be > 0")
    try:
        return MigrationConfig(**{name: value for name, (_, value) in flags.items() if value is not None})
    except ValidationError as exc:
        # The model names its fields; the operator typed flags: say it in the flags' words.
        reason = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        for name, (flag, _) in flags.items():
            reason = reason.replace(name, flag)
        raise InvalidArgument("--migration-timeout", reason) from None
