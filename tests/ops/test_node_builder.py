"""One way to build a node: the node `laminar node run` and the Dagster job run keeps the output
table and heartbeats several times per timeout, whatever it was configured with."""

from __future__ import annotations

from pathlib import Path

from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.ops.node_builder import build_node
from laminar_orchestration.store import LocalObjectStore
from laminar_orchestration.table import TableCommitter, table_location
from tests.ledgers import new_ledger


def test_a_built_node_keeps_the_output_table_and_several_heartbeats_per_timeout(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    new_ledger(store)
    config = NodeConfig(
        store_url=store.url, node_id=3, workdir=str(tmp_path / "n3"), heartbeat_interval_s=5.0, heartbeat_timeout_s=6.0
    )
    node = build_node(config, store=store)
    assert node.table_feed is not None
    committer = node.table_feed.table
    assert isinstance(committer, TableCommitter)
    # Its data files go under its own folder, where a node's storage policy lets it write.
    assert (committer.node, committer.location) == (3, table_location(store))
    assert node.config.heartbeat_interval_s == 2.0
    assert build_node(config.model_copy(update={"heartbeat_interval_s": 1.0}), store=store).config == config.model_copy(
        update={"heartbeat_interval_s": 1.0}
    )
