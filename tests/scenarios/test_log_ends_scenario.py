"""The log-ends scenario: while the node cannot read the recorded log ends for longer than their
trust, a caught-up worker reads its log within about `idle_poll_max_s` of an append, and a new worker
is never handed the node's last-read ends as fresher than they are; with the fix put back
(`revert_log_ends_fallback`), fresh seeds find a worker asleep until its fallback poll or handed
stale ends as fresh. The real `LogWatch` on a simulated clock; the seed decides appends, outages and
moves. ``LAMINAR_LOG_ENDS_SEED=<base>`` replays a run."""

from __future__ import annotations

from laminar_dev.sim import Knobs
from laminar_dev.sim.log_ends import Broken, run_log_ends_scenario
from tests.seeds import fresh_base_seed

REVERTED = Knobs(revert_log_ends_fallback=True)


def test_fresh_seeds_a_caught_up_worker_polls_once_the_ends_are_untrusted() -> None:
    base = fresh_base_seed("LAMINAR_LOG_ENDS_SEED", "log-ends")
    results = [run_log_ends_scenario(seed) for seed in range(base, base + 100)]
    for r in results:
        assert r.ok, f"seed {r.seed}: outages {r.outages}: {r.violations}"
    assert sum(r.checked for r in results) > 0, "no seed appended while the ends were untrusted"
    assert any(r.moves for r in results), "no seed moved the partition to a new worker"


def test_without_the_fallback_most_fresh_seeds_find_a_sleeping_worker_or_stale_ends() -> None:
    base = fresh_base_seed("LAMINAR_LOG_ENDS_SEED", "log-ends")
    results = [run_log_ends_scenario(seed, REVERTED) for seed in range(base, base + 100)]
    found = [r for r in results if not r.ok]
    assert len(found) > len(results) // 2, f"only {len(found)} of {len(results)} seeds from {base} found the revert"
    broken = {v.broken for r in found for v in r.violations}
    assert broken == set(Broken), f"seeds from {base} found only {broken}"
    for r in found:
        assert run_log_ends_scenario(r.seed).ok, f"seed {r.seed} fails with the fix too"
