"""The chaos suite's scenarios and how much each does (the short and long profiles)."""

from __future__ import annotations

from dataclasses import dataclass

from laminar_orchestration.protocol.tasks import MigrationConfig

NODE_IDS = (1, 2, 3)
PARTITIONS = 4
KEYS = 40

#: Every scenario, in the order they run (node availability is planned for this order).
SCENARIOS: tuple[str, ...] = (
    "store-faults",
    "kill9-mid-batch",
    "zombie",
    "kill9-mid-release",
    "orchestrator-killed",
    "migrations-rebalance",
    "rolling-restart",
)


@dataclass(frozen=True)
class Profile:
    """How much each scenario does."""

    name: str
    #: Events of the big batch a node is killed or paused in the middle of.
    batch_events: int
    #: Background load: events per chunk, and the pause between chunks.
    load_events: int
    load_interval_s: float
    #: Repetitions of the kill, zombie and orchestrator scenarios.
    repetitions: int
    rebalance_rounds: int
    #: How many nodes the rolling restart restarts.
    rolling_nodes: int
    #: store-faults: events produced through the faulty store, rounds of migrations, fault rate.
    fault_events: int
    fault_rounds: int
    fault_rate: float
    #: The whole run: scenarios that would start after it are skipped.
    budget_s: float
    #: After each scenario: how long everything produced may take to be committed.
    commit_timeout_s: float


PROFILES: dict[str, Profile] = {
    "short": Profile(
        name="short",
        batch_events=160_000,
        load_events=12_000,
        load_interval_s=0.5,
        repetitions=1,
        rebalance_rounds=1,
        rolling_nodes=2,
        fault_events=24_000,
        fault_rounds=2,
        fault_rate=0.03,
        # ~2 minutes on an idle machine, 7 on a loaded one (418 s seen): room for a slower one still.
        budget_s=720.0,
        commit_timeout_s=90.0,
    ),
    "long": Profile(
        name="long",
        batch_events=400_000,
        load_events=40_000,
        load_interval_s=0.3,
        repetitions=2,
        rebalance_rounds=3,
        rolling_nodes=3,
        fault_events=120_000,
        fault_rounds=4,
        fault_rate=0.05,
        budget_s=1500.0,
        commit_timeout_s=180.0,
    ),
}

#: Coordinator limits for the chaos runs: generous, the machine is busy with Spark.
MIGRATION_CONFIG = MigrationConfig(
    migration_timeout_s=90.0, release_wait_timeout_s=30.0, checkpoint_transfer_timeout_s=90.0
)
