"""A worker node's configuration (``laminar node run``): a misspelt or out-of-range setting is refused
by name when the config is made, never silently ignored, and a node's config does not change once made."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from laminar_orchestration.dataplane.config import WARM_UP_BATCHES, NodeConfig

STORE = "file:///tmp/laminar-store"


def _refused(**settings: Any) -> ValidationError:
    with pytest.raises(ValidationError) as refused:
        NodeConfig(store_url=STORE, **{"node_id": 1, **settings})
    return refused.value


def test_a_misspelt_setting_is_refused_by_name() -> None:
    # A typo must not leave the node running on the default it meant to change.
    error = _refused(heartbeat_timout_s=3.0)
    [problem] = error.errors()
    assert (problem["type"], problem["loc"]) == ("extra_forbidden", ("heartbeat_timout_s",))
    assert "heartbeat_timout_s" in str(error)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("node_id", 0),  # node 0 marks a chain's seal, never a node
        ("node_id", "one"),
        ("heartbeat_interval_s", 0.0),
        ("heartbeat_timeout_s", -1.0),
        ("reconcile_interval_s", 0.0),
        ("idle_poll_s", 0.0),
        ("migration_poll_s", -0.01),
        ("batch_max_events", 0),
        ("spark_warm_up_batches", -1),
        ("checkpoint_every_batches", 0),
        ("checkpoint_delta_fraction", 0.0),
        ("checkpoint_min_delta_bytes", -1),
        ("checkpoint_every_s", 0.0),
        ("restart_backoff_initial_s", 0.0),
        ("metrics_port", -1),
        ("metrics_port", 65536),
    ],
)
def test_an_out_of_range_setting_is_refused_by_name(name: str, value: object) -> None:
    [problem] = _refused(**{name: value}).errors()
    assert problem["loc"] == (name,)


def test_the_edges_of_each_range_are_accepted() -> None:
    config = NodeConfig(
        store_url=STORE,
        node_id=1,
        spark_warm_up_batches=0,
        checkpoint_min_delta_bytes=0,
        batch_max_events=1,
        checkpoint_every_batches=1,
        metrics_port=65535,
    )
    assert (config.node_id, config.spark_warm_up_batches, config.metrics_port) == (1, 0, 65535)
    assert NodeConfig(store_url=STORE, node_id=1, metrics_port=0).metrics_port == 0  # 0: any free port


def test_a_nodes_config_does_not_change_once_made() -> None:
    config = NodeConfig(store_url=STORE, node_id=1)
    with pytest.raises(ValidationError):
        config.node_id = 2
    assert config.node_id == 1


def test_by_default_several_heartbeats_fit_in_a_timeout_and_spark_warms_up() -> None:
    config = NodeConfig(store_url=STORE, node_id=1)
    # One lost heartbeat PUT must not make a live node look dead.
    assert config.heartbeat_timeout_s >= 3 * config.heartbeat_interval_s
    assert config.spark_warm_up_batches == WARM_UP_BATCHES > 0
    assert (config.metrics_port, config.nudge_host, config.standby_for) == (None, "127.0.0.1", ())
