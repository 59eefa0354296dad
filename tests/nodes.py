"""Node configs for tests that run a node in-process and watch it react."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.store import ObjectStore


def quick_node_config(store: ObjectStore, tmp_path: Path, **settings: Any) -> NodeConfig:
    """Node 1 on `store`, working under `tmp_path`, heartbeating every 0.1 s and reconciling every 20 ms
    (a test watches it react within a second), with `settings` on top."""
    quick: dict[str, Any] = {"heartbeat_interval_s": 0.1, "reconcile_interval_s": 0.02, **settings}
    return NodeConfig(store_url=store.url, node_id=1, workdir=str(tmp_path / "node1"), **quick)
