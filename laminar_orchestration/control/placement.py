"""Deciding where partitions run: a pure planner, no I/O.

Plain mappings in, a plan out, deterministic. It is sticky: a partition moves
only when balance requires it. Partitions of dead or unknown nodes and
unassigned ones are always placed; beyond that, partitions move from
over-loaded to under-loaded nodes only until every live node holds between
``floor(quota)`` and ``ceil(quota)`` partitions, where a node's quota is its
weighted share of all partitions. The number of moves is the minimum any
balanced assignment needs.

What it is given is read from the ledger by `snapshot` (`snapshot.ownership_map`,
`snapshot.live_node_ids`); carrying moves out is `moves`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from laminar_orchestration.errors import InvalidInputError
from laminar_orchestration.identity import UNASSIGNED

__all__ = [
    "AssignmentError",
    "AssignmentPlan",
    "Move",
    "NodeBounds",
    "failover_target",
    "least_loaded_node",
    "move_participants",
    "node_loads",
    "plan_assignment",
    "schedule_waves",
    "weighted_bounds",
]


class AssignmentError(InvalidInputError, ValueError):
    """The inputs admit no assignment (no live node, bad weights)."""

    reason: str

    message = "{reason}"


@dataclass(frozen=True, order=True)
class Move:
    """Move `partition` from `from_node` (0: unassigned) to `to_node`."""

    partition: int
    from_node: int
    to_node: int

    def to_json(self) -> dict[str, int]:
        """The move as plain JSON (CLI output, Dagster metadata)."""
        return {"partition": self.partition, "from_node": self.from_node, "to_node": self.to_node}


@dataclass(frozen=True)
class NodeBounds:
    """A live node's weighted quota and the partition counts that count as balanced."""

    quota: float
    low: int
    high: int


@dataclass(frozen=True)
class AssignmentPlan:
    """The planner's answer: the owner of every partition afterwards, and the moves to get there."""

    target: dict[int, int]
    moves: list[Move]
    bounds: dict[int, NodeBounds]
    #: Partitions per live node before / after the moves.
    counts_before: dict[int, int]
    counts_after: dict[int, int]

    @property
    def balanced(self) -> bool:
        """True when the input needed no move at all."""
        return not self.moves

    def to_json(self) -> dict[str, Any]:
        """Moves, target and per-node counts as plain JSON (CLI output, Dagster metadata)."""
        return {
            "moves": [m.to_json() for m in self.moves],
            "target": {str(p): n for p, n in sorted(self.target.items())},
            "nodes": [
                {
                    "node": n,
                    "quota": round(b.quota, 3),
                    "low": b.low,
                    "high": b.high,
                    "before": self.counts_before.get(n, 0),
                    "after": self.counts_after.get(n, 0),
                }
                for n, b in sorted(self.bounds.items())
            ],
        }


def _fraction(value: float, what: str) -> Fraction:
    if not math.isfinite(value) or value < 0:
        raise AssignmentError(f"{what} must be a finite number >= 0, got {value!r}")
    # limit_denominator: 0.1 + 0.2 behaves like 3/10, so quotas land on integers when they should.
    return Fraction(value).limit_denominator(1_000_000)


def weighted_bounds(
    partitions: int, live_nodes: Iterable[int], weights: Mapping[int, float] | None = None
) -> dict[int, NodeBounds]:
    """Quota and balanced range of each live node: ``floor(quota) <= count <= ceil(quota)``.

    A node missing from `weights` has weight 1; weight 0 means "hold nothing".
    """
    nodes = sorted(set(live_nodes))
    if not nodes:
        raise AssignmentError("no live node to assign partitions to")
    if any(n <= UNASSIGNED for n in nodes):
        raise AssignmentError(f"node ids must be >= 1, got {[n for n in nodes if n <= UNASSIGNED]}")
    w = {n: _fraction(float((weights or {}).get(n, 1.0)), f"weight of node {n}") for n in nodes}
    total = sum(w.values(), Fraction(0))
    if total == 0:
        raise AssignmentError("the live nodes' weights are all 0: nobody can hold a partition")
    bounds = {}
    for n in nodes:
        quota = partitions * w[n] / total
        bounds[n] = NodeBounds(float(quota), math.floor(quota), math.ceil(quota))
    return bounds


def plan_assignment(
    current: Mapping[int, int],
    live_nodes: Iterable[int],
    weights: Mapping[int, float] | None = None,
) -> AssignmentPlan:
    """Plan the fewest moves that leave every partition on a live node, balanced by weight.

    `current` maps each partition to its owner (0: unassigned). Partitions on
    nodes outside `live_nodes` (dead, unknown) and unassigned ones are placed;
    partitions on live nodes stay unless their node holds more than
    ``ceil(quota)`` or another node needs them to reach ``floor(quota)``. The
    result does not depend on the iteration order of the inputs.
    """
    bounds = weighted_bounds(len(current), live_nodes, weights)
    owned: dict[int, list[int]] = {n: [] for n in bounds}
    orphans: list[int] = []
    for p in sorted(current):
        owner = current[p]
        if owner in owned:
            owned[owner].append(p)
        else:
            orphans.append(p)
    counts = {n: len(ps) for n, ps in owned.items()}

    # Target counts: as close to today's as the bounds allow (each partition a
    # node keeps is a move saved), then fixed up to sum to the partition count.
    # Clamping only ever raises nodes that will *receive* partitions to their
    # floor and lowers nodes that must *shed* to their ceiling, so a surplus can
    # only be cut from nodes keeping partitions (one unavoidable move each: cut
    # the fullest relative to quota), and a shortfall only given to receivers
    # (free: give it to the emptiest relative to quota).
    target = {n: min(max(counts[n], b.low), b.high) for n, b in bounds.items()}
    surplus = sum(target.values()) - len(current)
    while surplus > 0:
        n = min(
            (n for n in bounds if target[n] > bounds[n].low),
            key=lambda n: (-target[n] / bounds[n].quota, n),
        )
        target[n] -= 1
        surplus -= 1
    while surplus < 0:
        n = min(
            (n for n in bounds if target[n] < bounds[n].high),
            key=lambda n: (target[n] / bounds[n].quota, n),
        )
        target[n] += 1
        surplus += 1

    # Nodes above their target shed their highest-numbered partitions, so the
    # low-numbered ones stay put across repeated plans.
    pool = list(orphans)
    keep: dict[int, list[int]] = {}
    for n, ps in owned.items():
        keep[n] = ps[: target[n]]
        pool.extend(ps[target[n] :])
    pool.sort()
    deficit = {n: target[n] - len(keep[n]) for n in bounds}
    assignment = {p: n for n, ps in keep.items() for p in ps}
    moves = []
    for p in pool:
        # Fill the largest remaining gap first (ties: lowest node id) to spread the moves.
        n = min((n for n in bounds if deficit[n] > 0), key=lambda n: (-deficit[n], n))
        deficit[n] -= 1
        assignment[p] = n
        moves.append(Move(p, current[p], n))
    after = Counter(assignment.values())
    return AssignmentPlan(
        target=dict(sorted(assignment.items())),
        moves=moves,
        bounds=bounds,
        counts_before=counts,
        counts_after={n: after.get(n, 0) for n in bounds},
    )


def node_loads(current: Mapping[int, int], live_nodes: Iterable[int]) -> dict[int, int]:
    """Partitions held by each live node (live nodes holding nothing count 0)."""
    loads = dict.fromkeys(live_nodes, 0)
    for owner in current.values():
        if owner in loads:
            loads[owner] += 1
    return loads


def least_loaded_node(
    loads: Mapping[int, int],
    *,
    exclude: Collection[int] = (),
    weights: Mapping[int, float] | None = None,
) -> int | None:
    """The node in `loads` with the fewest partitions per unit of weight (ties: lowest id).

    None when every node is excluded (or has weight 0).
    """
    best: tuple[float, int] | None = None
    for node, load in loads.items():
        weight = float((weights or {}).get(node, 1.0))
        if node in exclude or weight <= 0:
            continue
        key = (load / weight, node)
        if best is None or key < best:
            best = key
    return None if best is None else best[1]


def failover_target(
    loads: Mapping[int, int], *, warm: Mapping[int, int] | None = None, exclude: Collection[int] = ()
) -> int | None:
    """Where a partition goes when its owner died: the live node with the warmest copy, else the least loaded.

    A warm standby takes over by applying only the deltas it lacks instead of
    downloading the whole state. `loads` holds the live candidates.
    """
    candidates = [n for n in (warm or {}) if n in loads and n not in exclude]
    if candidates:
        return min(candidates, key=lambda n: ((warm or {})[n], loads[n], n))
    return least_loaded_node(loads, exclude=exclude)


def move_participants(move: Move, live_nodes: Collection[int] | None) -> set[int]:
    """The nodes that do work in `move`: its new owner, and its old owner when that one is live."""
    # A dead or unassigned old owner does no work in a (forced) move, so it
    # does not use up one of its slots.
    nodes = {move.to_node}
    if move.from_node != UNASSIGNED and (live_nodes is None or move.from_node in live_nodes):
        nodes.add(move.from_node)
    return nodes


def schedule_waves(
    moves: Sequence[Move], max_per_node: int, *, live_nodes: Collection[int] | None = None
) -> list[list[Move]]:
    """Group `moves` into waves in which no node takes part in more than `max_per_node` moves.

    Greedy first fit in the given order, so the result is deterministic. With
    `live_nodes`, an old owner outside it (dead) does not count.
    """
    if max_per_node < 1:
        raise AssignmentError(f"max_per_node must be >= 1, got {max_per_node}")
    waves: list[list[Move]] = []
    usage: list[Counter[int]] = []
    for move in moves:
        nodes = move_participants(move, live_nodes)
        for wave, used in zip(waves, usage, strict=True):
            if all(used[n] < max_per_node for n in nodes):
                wave.append(move)
                used.update(nodes)
                break
        else:
            waves.append([move])
            usage.append(Counter(nodes))
    return waves
