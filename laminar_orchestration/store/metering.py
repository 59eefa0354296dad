"""Store requests counted the way S3 bills them: per method, per key family, per process.

Every request a backend sends is counted once (a retried request once per try),
so the figures are what a bill and a request log show. A key family is the key
with its partition, node, sequence and name parts dropped
(``ledger/partitions/00003/desired.json`` → ``ledger/partitions/desired.json``),
which keeps the families few and says which kind of record a request was for.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class RequestMethod(enum.StrEnum):
    """A request as S3 prices it."""

    GET = "GET"
    HEAD = "HEAD"
    PUT = "PUT"
    DELETE = "DELETE"
    LIST = "LIST"


#: Families kept apart per process; the rest are counted under `OTHER_FAMILY`.
MAX_FAMILIES = 64
OTHER_FAMILY = "other"


def key_family(key: str) -> str:
    """The kind of object `key` names: its path without the partition, node, sequence or name parts."""
    kept = [s for s in key.split("/") if s and not s[0].isdigit() and not (s.startswith("n-") and s[2:3].isdigit())]
    return "/".join(kept) or OTHER_FAMILY


class RequestPrices(BaseModel):
    """Price per 1,000 requests by method, in dollars (defaults: S3 Standard list prices, us-east-1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    put_per_1k: float = Field(default=0.005, ge=0)
    list_per_1k: float = Field(default=0.005, ge=0)
    get_per_1k: float = Field(default=0.0004, ge=0)
    head_per_1k: float = Field(default=0.0004, ge=0)
    delete_per_1k: float = Field(default=0.0, ge=0)

    def per_request(self, method: RequestMethod) -> float:
        return {
            RequestMethod.PUT: self.put_per_1k,
            RequestMethod.LIST: self.list_per_1k,
            RequestMethod.GET: self.get_per_1k,
            RequestMethod.HEAD: self.head_per_1k,
            RequestMethod.DELETE: self.delete_per_1k,
        }[method] / 1000.0

    def monthly_cost(self, rates: Mapping[str, float]) -> float:
        """Dollars per 30-day month at `rates` (requests per second by method name)."""
        month_s = 30 * 24 * 3600
        return sum(self.per_request(RequestMethod(m)) * r * month_s for m, r in rates.items())


@dataclass(frozen=True)
class RequestCounts:
    """Counts at one moment: by method, and by (method, key family)."""

    at: float
    by_method: Mapping[str, int]
    by_family: Mapping[tuple[str, str], int]

    def rates_since(self, earlier: RequestCounts) -> dict[str, float]:
        """Requests per second by method between `earlier` and this count."""
        span = max(self.at - earlier.at, 1e-9)
        return {m: (n - earlier.by_method.get(m, 0)) / span for m, n in self.by_method.items()}

    def family_rates_since(self, earlier: RequestCounts, *, top: int = 8) -> dict[str, float]:
        """The `top` busiest "METHOD family" pairs between `earlier` and this count, in requests per second."""
        span = max(self.at - earlier.at, 1e-9)
        rates = {
            f"{m} {fam}": (n - earlier.by_family.get((m, fam), 0)) / span for (m, fam), n in self.by_family.items()
        }
        busiest = sorted(((r, k) for k, r in rates.items() if r > 0), reverse=True)[:top]
        return {k: round(r, 3) for r, k in busiest}


class RequestMeter:
    """Thread-safe request counters; one per process is shared by every store it opens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._methods: Counter[str] = Counter()
        self._families: Counter[tuple[str, str]] = Counter()

    def count(self, method: RequestMethod, key: str) -> None:
        family = key_family(key)
        with self._lock:
            self._methods[method.value] += 1
            slot = (method.value, family)
            if slot not in self._families and len(self._families) >= MAX_FAMILIES:
                slot = (method.value, OTHER_FAMILY)
            self._families[slot] += 1

    def snapshot(self) -> RequestCounts:
        with self._lock:
            return RequestCounts(time.monotonic(), dict(self._methods), dict(self._families))


#: The process's meter: every backend counts into it unless given its own.
PROCESS_METER = RequestMeter()
