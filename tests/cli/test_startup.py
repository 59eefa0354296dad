"""A command that only moves partitions starts without the data plane's libraries: every `laminar
migrate` or `failover` launch pays its imports before its first request."""

from __future__ import annotations

import subprocess
import sys

#: Loaded by the commands that read or write data (`query`, `verify`, `node run`, `table`), never
#: needed to plan and drive a move.
HEAVY = ("pyarrow", "deltalake", "pyspark", "dagster", "boto3")


def test_the_move_commands_start_without_the_data_planes_libraries() -> None:
    probe = (
        "import sys\n"
        "from laminar_orchestration.cli import build_parser\n"
        "import laminar_orchestration.control.moves, laminar_orchestration.control.operations\n"
        "build_parser().parse_args(['migrate', '--partition', '0', '--to', '1'])\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "", f"imported at start: {done.stdout.strip()}"
