"""What the demo tells its user to try, and the output table as a downstream reader sees it.

`Walkthrough` holds where the demo's pieces are (store, UI, output table) and
renders the banner once the cluster is up: where everything is, then what to try
— migrate from the UI or a shell, kill a node, watch the assets, scrape the
metrics, read the table — and the kill hint the demo repeats after each
ownership change. `TableWatch` reads the output
table with `deltalake` alone, as any downstream consumer would (no laminar
code): a line per status table (its version and rows, from the log), and at the
end the rows and events of each partition next to what the manifests committed.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from laminar_orchestration.identity import UNASSIGNED
from laminar_orchestration.ops.errors import TableReadFailed
from laminar_orchestration.table import TableLocation


def program(name: str, bin_dir: Path | None = None) -> str:
    """`name` as a printed command names it: by path when `bin_dir` (default: this interpreter's
    folder, its venv's) holds it, so the line runs in a shell where no venv is active."""
    path = (bin_dir or Path(sys.executable).parent) / name
    return shlex.quote(str(path)) if path.exists() else name


@dataclass(frozen=True)
class Walkthrough:
    """Where the demo's pieces are, for the lines that tell the user what to try."""

    store_url: str
    demo_dir: Path
    #: The producer's load, in words.
    load: str
    #: The Dagster UI's URL (None: no webserver); `sensor`: its daemon fails killed nodes over.
    ui: str | None
    sensor: bool
    heartbeat_timeout_s: float
    table: TableLocation
    table_sync_interval_s: float
    #: Where the printed commands' programs are: this interpreter's own (its venv's), so a line
    #: pasted into a second shell runs without activating anything.
    bin_dir: Path = field(default_factory=lambda: Path(sys.executable).parent)

    def program(self, name: str) -> str:
        """`name` as the banner prints it: by path when this interpreter's folder holds it."""
        return program(name, self.bin_dir)

    def banner(
        self,
        stop_by: str,
        pids: Mapping[int, int],
        live: Mapping[int, int],
        owners: Mapping[int, int],
        dagster: Sequence[str],
        metrics_ports: Mapping[int, int],
    ) -> list[str]:
        """The banner once the cluster is up: where everything is (`pids`: every node's), then what to try."""
        by_node: dict[int, list[int]] = {}
        for p, n in sorted(owners.items()):
            by_node.setdefault(n, []).append(p)
        p0_owner = owners.get(0, UNASSIGNED)
        target = next((n for n in sorted(pids) if n != p0_owner), p0_owner)
        lines = ["", f"laminar demo is running (Ctrl-C to stop{stop_by})"]
        lines += [f"  store        {self.store_url}", f"  logs         {self.demo_dir}/"]
        for n, pid in pids.items():
            held = ", ".join(map(str, by_node.get(n, []))) or "-"
            lines.append(f"  node {n:<7} pid {pid:<8} partitions {held}")
        lines += [f"  load         {self.load}", self.table_line(), *dagster, ""]
        return [*lines, *self.try_it(target, owners, live, metrics_ports), ""]

    def table_line(self) -> str:
        """The banner's line naming the output table."""
        return (
            f"  output table {self.table.describe()}  (Delta Lake; nodes append every {self.table_sync_interval_s:g} s)"
        )

    def try_it(
        self, target: int, owners: Mapping[int, int], live: Mapping[int, int], metrics_ports: Mapping[int, int]
    ) -> list[str]:
        """The banner's "try it" block: `target` is the node to move partition 0 to, `live` the live nodes' pids."""
        ui = self.ui
        lines = ["try it:"]
        if ui is not None:
            lines += [
                f"  migrate    {ui}/locations/laminar/jobs/migrate_partition/playground",
                "             (Jobs → migrate_partition → Launchpad): type the config",
                f"             `partition: 0` and `to_node: {target}`, Launch Run, and watch each phase op run",
            ]
        how = "           or: " if ui is not None else "migrate    "
        lines.append(f"  {how}{self.program('laminar')} migrate --store {self.store_url} --partition 0 --to {target}")
        lines += self.kill_hint(owners, live)
        if ui is not None:
            lines.append(f"  watch      {ui}/assets/ownership_map (Catalog → ownership_map), {ui}/automation (sensors)")
        if metrics_ports:
            scrape = " · ".join(f"node {n} :{port}" for n, port in metrics_ports.items() if n)
            lines.append(
                f"  metrics    Prometheus: http://127.0.0.1:{metrics_ports[0]}/metrics (control plane); {scrape}"
            )
        lines.append(f"  read       {self.read_command()}")
        if not self.table.is_local:
            lines.append("             (with AWS_ENDPOINT_URL, and AWS_ALLOW_HTTP=true for http, in the environment)")
        return lines

    def read_command(self) -> str:
        """A shell line reading the output table downstream: plain deltalake, no laminar code."""
        code = f"from deltalake import DeltaTable; print(DeltaTable({self.table.uri!r}).to_pandas())"
        return f'{self.program("python")} -c "{code}"'

    def kill_hint(self, owners: Mapping[int, int], live: Mapping[int, int]) -> list[str]:
        """How to kill the live node holding the most partitions now (`live`: node -> pid), and what follows."""
        held = {n: sorted(p for p, o in owners.items() if o == n) for n in live}
        victim = max(held, key=lambda n: (len(held[n]), -n), default=None)
        if victim is None or not held[victim]:
            return ["  failover   no live node holds a partition"]
        what = f"(node {victim}, partitions {', '.join(map(str, held[victim]))})"
        then = (
            f"node_failure_sensor fails them over and records failover_partition runs ({self.ui}/runs)"
            if self.sensor
            else f"run: {self.program('laminar')} failover --store {self.store_url} --node {victim}"
        )
        return [
            f"  failover   kill -9 {live[victim]}   {what}",
            f"             once it has sent no heartbeat for {self.heartbeat_timeout_s:g}s, {then}",
        ]


@dataclass(frozen=True)
class TableRead:
    """The output table read downstream: its version, and rows and events (sum of ``batch_count``) per partition."""

    version: int
    rows: dict[int, int]
    events: dict[int, int]


#: The downstream read, in its own interpreter: deltalake and pyarrow only, no laminar code. The
#: storage options (credentials for S3) come on stdin, never on a command line.
_READ = """
import json, sys
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
try:
    table = DeltaTable(sys.argv[1], storage_options=json.loads(sys.stdin.read()) or None)
except TableNotFoundError:
    print("null")
    sys.exit(0)
data = table.to_pyarrow_table(columns=["partition", "batch_count"])
grouped = data.group_by("partition").aggregate([("batch_count", "count"), ("batch_count", "sum")]).to_pylist()
rows = {r["partition"]: r["batch_count_count"] for r in grouped}
events = {r["partition"]: r["batch_count_sum"] for r in grouped}
print(json.dumps({"version": table.version(), "rows": rows, "events": events}))
"""


class TableWatch:
    """The output table as a downstream reader sees it, through `deltalake` alone.

    The status line reads only the log, in the demo's process; the final read is a process of its
    own, as a consumer's would be (it also keeps Arrow's scan threads out of the demo's process).
    """

    def __init__(self, location: TableLocation) -> None:
        self.location = location
        self._handle: DeltaTable | None = None

    def _open(self) -> DeltaTable | None:
        if self._handle is not None:
            self._handle.update_incremental()
            return self._handle
        try:
            self._handle = DeltaTable(self.location.uri, storage_options=self.location.options())
        except TableNotFoundError:
            return None
        return self._handle

    def status_line(self) -> str:
        """Its version and rows, from the log alone (no data file is read): a line under each status table."""
        try:
            table = self._open()
        except Exception as exc:  # a demo's status line: the reason, never a crash
            self._handle = None
            return f"output table: unreadable now ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
        if table is None:
            return "output table: not created yet (each node appends its first batches within its interval)"
        counts = pa.table(table.get_add_actions(flatten=True))
        rows = sum(n or 0 for n in counts["num_records"].to_pylist()) if counts.num_rows else 0
        return f"output table: version {table.version()} · {rows:,} rows · read it with deltalake (see `read` above)"

    def read(self, timeout_s: float = 120.0) -> TableRead | None:
        """Every row, as `DeltaTable(uri).to_pyarrow_table()` gives them in another process (None: no table
        yet). OperationFailedError with the reader's last words if it fails."""
        options = json.dumps(self.location.options() or {})
        done = subprocess.run(
            [sys.executable, "-c", _READ, self.location.uri],
            input=options,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise TableReadFailed(self.location.uri, " ".join(done.stderr.split()[-40:]))
        found = json.loads(done.stdout)
        if found is None:
            return None
        return TableRead(
            int(found["version"]),
            {int(p): int(n) for p, n in found["rows"].items()},
            {int(p): int(n) for p, n in found["events"].items()},
        )

    def final_lines(self, committed: Mapping[int, int]) -> list[str]:
        """The table read downstream at the end, each partition's events next to its committed offset."""
        head = (
            f"output table {self.location.describe()}, read with deltalake alone (DeltaTable(uri).to_pyarrow_table()):"
        )
        try:
            read = self.read()
        except (TableReadFailed, subprocess.TimeoutExpired) as exc:
            return [head, f"  could not read it: {exc}"]
        if read is None:
            return [head, "  no table yet: no node synced before the end"]
        lines = [head]
        for p in sorted(committed):
            lines.append(
                f"  partition {p}: {read.rows.get(p, 0):,} rows, {read.events.get(p, 0):,} events "
                f"(committed {committed[p]:,})"
            )
        behind = [p for p, n in sorted(committed.items()) if read.events.get(p, 0) != n]
        if behind:
            lines.append(
                f"  version {read.version}: partitions {', '.join(map(str, behind))} not caught up "
                "(a node stopped before its sync: `laminar table sync` appends the rest)"
            )
        else:
            lines.append(
                f"  version {read.version}: each partition's events in the table are exactly the committed ones"
            )
        return lines
