"""Many scenarios: consecutive seeds from a base seed, across worker processes, within a time budget."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from multiprocessing.pool import AsyncResult

from .world import ScenarioCounts, ScenarioResult, SimConfig, run_scenario


@dataclass
class SoakReport:
    """What a batch of scenarios did: counts, throughput, and the failures (seed and violation)."""

    base_seed: int
    scenarios: int = 0
    #: The finished scenarios' counts, summed.
    totals: ScenarioCounts = field(default_factory=ScenarioCounts.zero)
    elapsed_s: float = 0.0
    failures: list[ScenarioResult] = field(default_factory=list)

    def add(self, result: ScenarioResult) -> None:
        """Count one finished scenario."""
        self.scenarios += 1
        self.totals += result.counts
        if not result.ok:
            self.failures.append(result)

    @property
    def per_minute(self) -> float:
        """Complete scenarios per minute of wall time."""
        return self.scenarios / self.elapsed_s * 60 if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        """One line of figures."""
        n = max(1, self.scenarios)
        totals = self.totals
        load = "/".join(f"{x:.1f}" for x in os.getloadavg())
        return (
            f"base seed {self.base_seed}: {self.scenarios} scenarios in {self.elapsed_s:.1f}s "
            f"({self.per_minute:.0f}/min; {totals.cpu_s / n * 1000:.0f} ms CPU each, "
            f"{60 * n / max(totals.cpu_s, 1e-9):.0f}/min per idle core), {totals.steps / n:.0f} steps/scenario "
            f"({totals.fault_steps / n:.0f} with faults), {totals.describe()}, {len(self.failures)} failed; "
            f"load average {load}"
        )


def _seeds(base: int) -> Iterator[int]:
    seed = base
    while True:
        yield seed
        seed += 1


def soak(
    template: SimConfig,
    *,
    base_seed: int,
    budget_s: float,
    workers: int | None = None,
    stop_on_failure: bool = True,
    progress: Callable[[SoakReport], None] | None = None,
    progress_every_s: float = 10.0,
) -> SoakReport:
    """Run scenarios `base_seed`, `base_seed + 1`, ... (shaped like `template`) for `budget_s` seconds.

    Scenarios run in `workers` processes (all cores by default). Stops early
    at the first failure unless `stop_on_failure` is False.
    """
    report = SoakReport(base_seed)
    workers = workers or os.cpu_count() or 1
    start = time.monotonic()
    next_progress = start + progress_every_s
    seeds = _seeds(base_seed)
    # Not a plain fork: a test process holding other threads' locks (Spark, Dagster) can hang its children.
    ctx = multiprocessing.get_context("forkserver")
    with ctx.Pool(workers, initializer=_reset_termination) as pool:
        # A bounded window of scenarios in flight, results taken in seed order.
        pending: deque[AsyncResult[ScenarioResult]] = deque()
        while True:
            while len(pending) < 4 * workers:
                pending.append(pool.apply_async(run_scenario, (replace(template, seed=next(seeds)),)))
            report.add(pending.popleft().get())
            now = time.monotonic()
            report.elapsed_s = now - start
            if progress is not None and now >= next_progress:
                progress(report)
                next_progress = now + progress_every_s
            if (stop_on_failure and report.failures) or now - start >= budget_s:
                break
        pool.terminate()
    report.elapsed_s = time.monotonic() - start
    return report


def _reset_termination() -> None:
    """A worker ends on SIGTERM (`Pool.terminate`) even if it inherited SIGTERM ignored (a run in the background)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def search(
    template: SimConfig,
    seeds: range,
    wanted: Callable[[ScenarioResult], bool],
    *,
    workers: int | None = None,
) -> ScenarioResult | None:
    """The first scenario over `seeds` (in seed order) that `wanted` accepts, or None.

    Runs in a pool of `workers` processes (default: one a core); with ``workers=1``, in this process:
    starting a pool costs seconds of imports, more than a short search whose cores are busy anyway.
    """
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        return next((r for r in map(run_scenario, (replace(template, seed=s) for s in seeds)) if wanted(r)), None)
    # Not a plain fork: a test process holding other threads' locks (Spark, Dagster) can hang its children.
    ctx = multiprocessing.get_context("forkserver")
    with ctx.Pool(workers, initializer=_reset_termination) as pool:
        for result in pool.imap(run_scenario, (replace(template, seed=s) for s in seeds), chunksize=2):
            if wanted(result):
                pool.terminate()
                return result
    return None
