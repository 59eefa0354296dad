"""Processing: the user's stream and the logic that runs on it.

* `schema` - a stream's record schema (`StreamSchema`): its columns, key and event time;
* `contract` - what a node asks of a processor per batch (`Processor`, `FoldContext`,
  `BatchFold`) and the event-time rule (`EventTimeProgress`: watermark and late events);
* `keyed` - `KeyedProcessor`, a per-key fold with optional state TTL, and the default
  `keyed_aggregation`;
* `windows`, `sessions`, `dedup` - built-in event-time processors: tumbling and sliding
  windows, session windows, deduplication by id within a TTL; `aggregates` - their
  mergeable aggregates (`Agg`);
* `codec` - state values of any Arrow type as bytes, a batch of keys at a time;
* `registry` - processors by name (``package.module:attribute``, entry points) and their
  fingerprints.

May import the package root only: the source log (`protocol`) and the data plane build on it.
"""

from laminar_orchestration.processing.aggregates import Agg
from laminar_orchestration.processing.contract import BatchFold, EventTimeProgress, FoldContext, Processor
from laminar_orchestration.processing.dedup import Deduplicate
from laminar_orchestration.processing.keyed import KeyedProcessor, keyed_aggregation
from laminar_orchestration.processing.registry import load_processor
from laminar_orchestration.processing.schema import StreamSchema
from laminar_orchestration.processing.sessions import SessionWindows
from laminar_orchestration.processing.windows import Sliding, Tumbling, WindowedAggregation

__all__ = [
    "Agg",
    "BatchFold",
    "Deduplicate",
    "EventTimeProgress",
    "FoldContext",
    "KeyedProcessor",
    "Processor",
    "SessionWindows",
    "Sliding",
    "StreamSchema",
    "Tumbling",
    "WindowedAggregation",
    "keyed_aggregation",
    "load_processor",
]
