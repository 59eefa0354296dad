"""The README's "Using it" commands work as written, in its order, as a user types them: the
`laminar` entry point, two Spark nodes started in the background, the store from `LAMINAR_STORE`.

The block is read from README.md itself, so a command renamed, a flag dropped or an exit code
changed in the code fails here until the README says so too. Between the commands the test waits
for what a user would wait for (the nodes to catch up, a node to be dead before its failover) and
ends by checking that every event was committed exactly once.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from laminar_dev.localcluster import stop_processes

pytestmark = [pytest.mark.spark, pytest.mark.processes]

README = Path(__file__).resolve().parents[2] / "README.md"
LAMINAR = Path(sys.executable).parent / "laminar"
#: The README produces a million events; the same command with fewer keeps two Spark nodes on a
#: 2-core machine to seconds. Only the number changes, never a flag.
SMALLER = {"--count": "20000"}
#: Exit codes the README promises other than 0, by the command's words.
EXPECTED_EXIT = {("migrate", "--cancel"): 1}  # "exit 1 if none": nothing is in flight by then


@dataclass(frozen=True)
class ReadmeCommand:
    """One line of the block: its words, and whether the README runs it in the background (`&`)."""

    argv: tuple[str, ...]
    background: bool


def readme_commands() -> list[ReadmeCommand]:
    """The commands of the README's "Using it" block, comments dropped."""
    section = README.read_text().split("\n## Using it\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    commands = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            background = words[-1] == "&"
            commands.append(ReadmeCommand(tuple(words[:-1] if background else words), background))
    return commands


def _expected_exit(argv: tuple[str, ...]) -> int:
    return next((code for words, code in EXPECTED_EXIT.items() if set(words) <= set(argv)), 0)


def _smaller(argv: tuple[str, ...]) -> list[str]:
    words = list(argv)
    for flag, value in SMALLER.items():
        if flag in words:
            words[words.index(flag) + 1] = value
    return words


class Shell:
    """The user's terminal: an environment with `export`s, foreground commands, background nodes."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.env = dict(os.environ)
        self.background: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def run(self, command: ReadmeCommand) -> subprocess.CompletedProcess[str] | None:
        name, *args = _smaller(command.argv)
        if name == "export":
            key, value = args[0].split("=", 1)
            self.env[key] = value
            return None
        assert name == "laminar", f"the README runs {name!r}; this test knows only `laminar` and `export`"
        if command.background:
            label = " ".join(args)
            self.logs[label] = self.cwd / f"background-{len(self.logs)}.log"
            with open(self.logs[label], "wb") as log:
                self.background[label] = subprocess.Popen(
                    [str(LAMINAR), *args], cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT
                )
            return None
        return subprocess.run(
            [str(LAMINAR), *args], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=300, check=False
        )

    def status(self) -> dict[str, Any]:
        done = self.run(ReadmeCommand(("laminar", "status", "--json"), background=False))
        assert done is not None and done.returncode == 0, done
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def wait_caught_up(self, owners: set[int], timeout_s: float = 240) -> dict[str, Any]:
        """Until every partition is active on one of `owners` and has committed its whole log."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            parts = status["partitions"]
            if all(p["owner"] in owners and p["status"] == "active" and p["lag"] == 0 for p in parts):
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"not caught up on nodes {owners} in {timeout_s} s: {parts}\n{self.tails()}")
            time.sleep(1.0)

    def wait_nodes(self, alive: set[int], timeout_s: float = 120) -> None:
        """Until the nodes `laminar status` lists alive are `alive` (a node registers before its Spark
        is up; a killed one is listed dead once its heartbeat timeout lapsed)."""
        deadline = time.monotonic() + timeout_s
        while {n["node"] for n in self.status()["nodes"] if n["alive"]} != alive:
            if time.monotonic() > deadline:
                raise AssertionError(f"not exactly nodes {alive} alive in {timeout_s} s\n{self.tails()}")
            time.sleep(0.5)

    def tails(self) -> str:
        return "\n".join(f"--- {label}\n{log.read_text()[-2000:]}" for label, log in self.logs.items())

    def node(self, node_id: int) -> subprocess.Popen[bytes]:
        return next(proc for label, proc in self.background.items() if f"--node-id {node_id}" in label)


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    terminal = Shell(tmp_path)
    yield terminal
    stop_processes(terminal.background.values())


def test_the_readme_block_is_what_this_test_runs() -> None:
    """The parse itself: the block exports a store, starts two nodes in the background and runs the
    tour's commands in the foreground (a README reshaped beyond this test's reading fails here)."""
    commands = readme_commands()
    assert commands[0].argv[0] == "export" and commands[0].argv[1].startswith("LAMINAR_STORE=")
    assert [c.argv for c in commands if c.background] == [
        ("laminar", "node", "run", "--node-id", "1"),
        ("laminar", "node", "run", "--node-id", "2"),
    ]
    assert {c.argv[1] for c in commands[1:]} >= {"init", "produce", "rebalance", "migrate", "failover", "verify"}


def test_every_command_of_the_readme_works_as_written(shell: Shell, tmp_path: Path) -> None:
    outputs: dict[str, str] = {}
    for command in readme_commands():
        if command.argv[0] == "export":  # the README's store, moved into this test's directory
            command = ReadmeCommand(("export", f"LAMINAR_STORE={(tmp_path / 'store').as_uri()}"), False)
        words = command.argv[1:3]
        if words[:1] == ("rebalance",):
            shell.wait_nodes({1, 2})  # as the README says: once `laminar status` lists them
        if words == ("migrate", "--partition") and "--cancel" not in command.argv:
            shell.wait_caught_up({1, 2})  # the user looked at `laminar status` first
        if words[:1] == ("failover",):
            # The README's failover is for a dead node: this is where node 1 dies.
            shell.wait_caught_up({1, 2})
            shell.node(1).send_signal(signal.SIGKILL)
            shell.node(1).wait(30)
            shell.wait_nodes({2})  # `laminar status` shows it dead
        done = shell.run(command)
        if done is None:
            continue
        expected = _expected_exit(command.argv)
        assert done.returncode == expected, (
            f"`{' '.join(command.argv)}` exited {done.returncode}, the README says {expected}\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}\n{shell.tails()}"
        )
        outputs[" ".join(command.argv[1:])] = done.stdout
        if words == ("rebalance",):
            shell.wait_caught_up({1, 2})

    # What the tour promised, seen from the outside.
    status = shell.wait_caught_up({2})
    assert {p["owner"] for p in status["partitions"]} == {2}  # node 1's partitions failed over to node 2
    assert status["partitions"][0]["committed_offset"] > 0
    lookup = next(text for line, text in outputs.items() if line.startswith("query") and "--key" in line)
    key = next(w for line in outputs if "--key" in line for w in line.split() if w.startswith("k"))
    assert key in lookup and "count" in lookup, f"the README's key lookup found nothing: {lookup!r}"
    assert "OK" in outputs["verify"], outputs["verify"]
    # `laminar status` listed the four partitions `laminar init` made.
    assert _partitions_listed(outputs["status"]) == 4, outputs["status"]


def _partitions_listed(status_text: str) -> int:
    """The rows of the partition table: from its PARTITION header to the first line that is not a row."""
    lines = status_text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["PARTITION"])
    rows = 0
    for line in lines[header + 1 :]:
        if not line.split()[:1] or not line.split()[0].isdigit():
            break
        rows += 1
    return rows
