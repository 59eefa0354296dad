"""The chaos suite: faults on purpose, then an audit of every promise (``python -m laminar_dev.chaos``).

Scenarios run on one local cluster (3 node processes, 4 partitions, loopback
only) that is started once, because a node's Spark start-up costs ~20 s:

* ``store-faults`` - in-process nodes (the real runtime with a pyarrow fold
  instead of Spark), the coordinator, a producer and a deliberately stale
  writer, all through `FaultInjectingStore` -> `RetryingStore` (5xx and
  throttling bursts, added latency, responses lost after an applied write), on
  the local store and on a real S3 protocol server (moto, started on
  loopback). Runs while the node processes boot.
* ``kill9-mid-batch`` - SIGKILL a node while Spark is running one of its
  batches (seen by the batch's staging directory), then a forced failover.
* ``zombie`` - SIGSTOP a node mid-batch past its heartbeat timeout, fail it
  over, SIGCONT it: it must not commit anything for what it lost.
* ``kill9-mid-release`` - a graceful migration whose old owner is SIGKILLed
  as soon as the recorded phase becomes Uploading/Released; then the forced path.
* ``orchestrator-killed`` - ``laminar migrate`` as a subprocess, SIGKILLed
  mid-migration, then resumed from the recorded phase.
* ``migrations-rebalance`` - concurrent migrations and weighted rebalances
  (cluster epoch bumped) while load runs.
* ``rolling-restart`` - SIGTERM, restart and take back, node after node.

After each scenario, with everything produced committed, `verify.audit_store`
(exactly-once of output and state), `verify.audit_history` (the immutable
epoch history cross-checked against every manifest and fenced object) and an
independent per-key count against what was produced are run. Each row reports
the scenario's own figures (differences of cumulative audits): events produced
and committed, duplicates and losses (must be 0), stale writes attempted and
rejected, stale writes accepted after the fence (must be 0), revocations,
epochs granted, double grants (epochs acted on by two nodes; must be 0), the
most owners seen in any epoch (must be 1), and wedged migrations (migration
records left non-terminal at the end; must be 0).

Modules, one concept each: `profiles` (scenarios and how much they do),
`results` (the report), `evidence` (audits and node-log counts), `arrow`
(in-process nodes without Spark), `migrations` (the library's moves, retried),
`store_faults`, `processes` (the node-process scenarios) and `suite` (the run).
"""

from .arrow import ArrowBatchEngine, ArrowNode
from .evidence import LogCounts, Measure, count_revocations, measure
from .profiles import PROFILES, SCENARIOS, Profile
from .results import ScenarioResult, format_table, report_json
from .store_faults import run_store_faults
from .suite import main, run_chaos

__all__ = [
    "PROFILES",
    "SCENARIOS",
    "ArrowBatchEngine",
    "ArrowNode",
    "LogCounts",
    "Measure",
    "Profile",
    "ScenarioResult",
    "count_revocations",
    "format_table",
    "main",
    "measure",
    "report_json",
    "run_chaos",
    "run_store_faults",
]
