"""One row of the chaos report per scenario, as a fixed-width table or JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ScenarioResult:
    """The figures of one scenario (its own: differences of the audits before and after it)."""

    name: str
    backend: str
    events_produced: int = 0
    events_committed: int = 0
    duplicates: int = 0
    losses: int = 0
    stale_writes_attempted: int = 0
    stale_writes_rejected: int = 0
    #: Partitions a fenced node's kill-switch revoked (node logs "REVOKED").
    revoked: int = 0
    epochs_granted: int = 0
    #: Epochs acted on by more than one node.
    double_grants: int = 0
    max_owners_per_epoch: int = 0
    #: Migration records left non-terminal (neither active, failed nor cancelled) at the end.
    wedged_migrations: int = 0
    duration_s: float = 0.0
    #: Whether the scenario creates a zombie whose stale writes are attempted deterministically.
    deterministic_stale_writes: bool = False
    issues: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        """Ran, and every promise held."""
        return (
            self.skipped is None
            and self.error is None
            and not self.issues
            and self.duplicates == 0
            and self.losses == 0
            and self.max_owners_per_epoch <= 1
            and self.double_grants == 0
            and self.wedged_migrations == 0
            and self.stale_writes_accepted == 0
        )

    @property
    def stale_writes_accepted(self) -> int:
        """Stale writes that became visible after the fence: must be 0."""
        return self.stale_writes_attempted - self.stale_writes_rejected

    @property
    def verdict(self) -> str:
        if self.skipped is not None:
            return "skipped"
        return "ok" if self.ok else "FAILED"

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "stale_writes_accepted": self.stale_writes_accepted,
            "ok": self.ok,
            "verdict": self.verdict,
            "duration_s": round(self.duration_s, 3),
        }


_COLUMNS = (
    ("scenario", "<"),
    ("backend", "<"),
    ("produced", ">"),
    ("committed", ">"),
    ("dup", ">"),
    ("loss", ">"),
    ("stale att/rej", ">"),
    ("stale acc", ">"),
    ("revoked", ">"),
    ("epochs", ">"),
    ("dbl grant", ">"),
    ("max own", ">"),
    ("wedged", ">"),
    ("time", ">"),
    ("verdict", "<"),
)


def format_table(results: Sequence[ScenarioResult], *, title: str = "", notes: bool = True) -> str:
    """A fixed-width table, one row per scenario, then each scenario's notes, issues and error."""
    rows = [
        [
            r.name,
            r.backend,
            str(r.events_produced),
            str(r.events_committed),
            str(r.duplicates),
            str(r.losses),
            f"{r.stale_writes_attempted}/{r.stale_writes_rejected}",
            str(r.stale_writes_accepted),
            str(r.revoked),
            str(r.epochs_granted),
            str(r.double_grants),
            str(r.max_owners_per_epoch),
            str(r.wedged_migrations),
            f"{r.duration_s:.1f}s",
            r.verdict if r.skipped is None else f"skipped: {r.skipped}",
        ]
        for r in results
    ]
    header = [name for name, _ in _COLUMNS]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        out = []
        for (_, align), cell, width in zip(_COLUMNS, cells, widths, strict=True):
            out.append(cell.rjust(width) if align == ">" else cell.ljust(width))
        return "  ".join(out).rstrip()

    rule = "-" * len(line(header))
    text = ([title] if title else []) + [rule, line(header), rule, *(line(r) for r in rows), rule]
    if notes:
        for r in results:
            extra = [*r.notes, *(f"ISSUE: {i}" for i in r.issues)]
            if r.error:
                extra.append(f"ERROR: {r.error}")
            if extra:
                text.append(f"{r.name} [{r.backend}]:")
                text.extend(f"  - {e}" for e in extra)
    return "\n".join(text)


def report_json(results: Sequence[ScenarioResult], **meta: Any) -> dict[str, Any]:
    """The machine-readable report: run metadata, overall verdict and every scenario."""
    ran = [r for r in results if r.skipped is None]
    return {**meta, "ok": bool(ran) and all(r.ok for r in ran), "scenarios": [r.to_json() for r in results]}
