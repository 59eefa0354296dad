"""What every `laminar` command shares: ``--store`` (default ``LAMINAR_STORE``, else ``./.laminar/store``) and
``--json`` declared once by the base class, a store URL that cannot be used named in one line with exit code
2, a missing local store never created by a command that only reads, and the argument checks that name
their flag before anything is read or written.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from laminar_orchestration.cli.base import (
    Command,
    add_migration_limits,
    check_at_least,
    check_node_id,
    migration_config,
    parse_partition_list,
    parse_weights,
)
from laminar_orchestration.errors import InvalidArgument
from laminar_orchestration.protocol.tasks import MigrationConfig
from laminar_orchestration.store import LocalObjectStore
from tests.cli.conftest import run_error
from tests.processes import laminar


@pytest.mark.processes
def test_store_defaults_to_env_then_working_directory(tmp_path: Path) -> None:
    env_store = (tmp_path / "from-env").as_uri()
    os.environ["LAMINAR_STORE"] = env_store
    try:
        assert laminar("init", "--partitions", "1", cwd=tmp_path).returncode == 0
        assert LocalObjectStore(tmp_path / "from-env", create=False).object_path("ledger/cluster.json").exists()
    finally:
        del os.environ["LAMINAR_STORE"]
    assert laminar("init", "--partitions", "1", cwd=tmp_path).returncode == 0
    assert LocalObjectStore(tmp_path / ".laminar" / "store", create=False).object_path("ledger/cluster.json").exists()


@pytest.mark.processes
@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://somewhere/x", "unsupported scheme 'ftp'"),
        ("s3://", "has no bucket"),
        ("file://host/x", "take no host"),
    ],
)
def test_bad_store_url_is_named(url: str, message: str) -> None:
    result = laminar("status", "--store", url)
    assert result.returncode == 2
    assert message in result.stderr and url in result.stderr


@pytest.mark.processes
def test_status_of_missing_local_store_does_not_create_it(tmp_path: Path) -> None:
    target = tmp_path / "typo"
    result = laminar("status", "--store", target.as_uri())
    assert result.returncode == 7 and "no local store" in result.stderr
    assert not target.exists()


@pytest.mark.parametrize(
    ("tail", "named"),
    [
        # Python refuses a NUL before the OS sees it (it was a traceback: ValueError: embedded null byte).
        pytest.param("x%00y", "NUL", id="nul"),
        pytest.param("nul%00/deeper/store", "NUL", id="nul-in-a-parent"),
        pytest.param("a" * 300 + "/store", "refuses the name", id="name-too-long"),  # ENAMETOOLONG
        pytest.param("%FF%FE", "not UTF-8", id="not-utf8"),  # was decoded lossily into another name
    ],
)
@pytest.mark.parametrize("command", ["init", "status"])
def test_a_store_url_the_os_refuses_is_invalid_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tail: str, named: str, command: str
) -> None:
    url = f"{tmp_path.as_uri()}/{tail}"
    argv = ["init", "--partitions", "2"] if command == "init" else [command]
    code, line = run_error(capsys, *argv, "--store", url)
    assert code == 2 and f"invalid store URL {url!r}" in line and named in line
    assert list(tmp_path.iterdir()) == []  # nothing created


class _Probe(Command):
    name = "probe"
    help = "a command that prints data"
    json_output = True


class _Group(Command):
    name = "group"
    help = "a group of two subcommands"
    subcommands = {"one": "the first", "two": "the second"}

    def add_subcommand_arguments(self, subcommand: str, parser: argparse.ArgumentParser) -> None:
        if subcommand == "two":
            parser.add_argument("--only-two", action="store_true")


class _OwnStore(Command):
    name = "own"
    help = "a command that makes its own store"
    shared_store = False


def _parser(*commands: Command) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="laminar")
    sub = parser.add_subparsers(dest="command_name", required=True)
    for command in commands:
        command.register(sub)
    return parser


def test_every_command_spells_store_and_json_the_same_way(capsys: pytest.CaptureFixture[str]) -> None:
    probe, group, own = _Probe(), _Group(), _OwnStore()
    parser = _parser(probe, group, own)
    args = parser.parse_args(["probe", "--store", "file:///s", "--json"])
    assert (args.command, args.store, args.json) == (probe, "file:///s", True)
    # No --store given: None, for `main` to fill in from LAMINAR_STORE or the working directory.
    assert parser.parse_args(["probe"]).store is None
    # A group: each subcommand takes the shared flags, and only its own besides.
    args = parser.parse_args(["group", "two", "--store", "file:///s", "--only-two"])
    assert (args.command, args.group_command, args.store, args.only_two) == (group, "two", "file:///s", True)
    for refused in (["group", "one", "--only-two"], ["group", "one", "--json"], ["own", "--store", "file:///s"]):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(refused)
        assert exited.value.code == 2, refused
    assert "unrecognized arguments" in capsys.readouterr().err


def _limits(*argv: str, concurrency: str | None = None) -> MigrationConfig:
    parser = argparse.ArgumentParser()
    add_migration_limits(parser, concurrency=concurrency)
    return migration_config(parser.parse_args(list(argv)))


def test_migration_limits_fill_the_config_and_must_be_positive() -> None:
    defaults = MigrationConfig()
    assert _limits() == defaults
    config = _limits("--transfer-timeout", "5", "--max-concurrent", "3", concurrency="max_concurrent_failovers")
    assert (config.checkpoint_transfer_timeout_s, config.max_concurrent_failovers) == (5.0, 3)
    assert config.max_concurrent_migrations == defaults.max_concurrent_migrations  # not the field named
    for flag in ("--migration-timeout", "--release-wait-timeout", "--transfer-timeout"):
        with pytest.raises(InvalidArgument) as zero:
            _limits(flag, "0")
        assert str(zero.value) == f"{flag}: 0.0 must be > 0"
    with pytest.raises(InvalidArgument) as negative:
        _limits("--max-concurrent", "-1", concurrency="max_concurrent_migrations")
    assert str(negative.value) == "--max-concurrent: -1 must be > 0"


def test_partition_lists_and_weights_parse() -> None:
    assert parse_partition_list("--partitions", " 0, 2,3 ,") == (0, 2, 3)
    assert parse_partition_list("--partitions", "") == ()
    assert parse_weights(["3=2.0", "1=0.5"]) == {3: 2.0, 1: 0.5}
    check_node_id("--to", None)  # not given: nothing to check
    check_node_id("--to", 1)
    check_at_least("--keys", None, 1)
    check_at_least("--keys", 1, 1)


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (lambda: parse_partition_list("--standby-for", "1,x"), "--standby-for: '1,x' is not a comma-separated list"),
        (lambda: parse_partition_list("--partitions", "2,-1"), "--partitions: partition -1 is negative"),
        (lambda: parse_weights(["3"]), "--weight: '3': expected NODE=WEIGHT"),
        (lambda: parse_weights(["x=1"]), "--weight: 'x=1': expected NODE=WEIGHT"),
        (lambda: check_node_id("--to", 0), "--to: node 0 is the 'unassigned' sentinel"),
        (lambda: check_node_id("--node", -2), "--node: -2 is not a node id"),
        (lambda: check_at_least("--keys", 0, 1), "--keys: 0 is below the minimum of 1"),
    ],
)
def test_a_bad_argument_is_named_by_its_flag(check: Callable[[], object], message: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check()
    assert str(raised.value).startswith(message)
