"""The baseline comparison's results (spark-ss and laminar, from one run) and its table: the rows side
by side, the ratios the targets are about, and the notes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from laminar_dev.localcluster import HEARTBEAT_TIMEOUT_S
from laminar_orchestration.protocol.tasks import MigrationPhase

from .baseline_load import LAMINAR, SS
from .baseline_spark import OutputAnalysis, SplitBrain, SsBig, SsKill, SsMove
from .baseline_worker import GRACEFUL_STOP_WAIT_S, SS_DRIVER_MEMORY
from .common import Row, median, verdict
from .migration_cluster import HEARTBEAT_INTERVAL_S, restore_summary
from .migration_runs import FailoverRun, MigrationRun

FAILOVER_TARGET_S = 15.0
GRACEFUL_TARGET_S = 5.0
#: laminar's planned-move unavailability and kill recovery: at most this fraction of spark-ss's (warm standby).
RATIO_TARGET = 0.5


@dataclass
class Results:
    ss_moves: list[SsMove] = field(default_factory=list)
    ss_move_analysis: OutputAnalysis | None = None
    ss_move_files: int = 0
    ss_kill_warm: SsKill | None = None
    ss_kill_cold: SsKill | None = None
    ss_kill_analysis: OutputAnalysis | None = None
    ss_splits: list[SplitBrain] = field(default_factory=list)
    lam_moves: list[MigrationRun] = field(default_factory=list)
    lam_kill: FailoverRun | None = None
    lam_split: SplitBrain | None = None
    lam_final_mismatch: int = 0
    lam_keys: int = 0
    lam_audit_duplicates: int = 0
    lam_audit_losses: int = 0
    lam_audit_issues: list[str] = field(default_factory=list)
    lam_orphans: int = 0
    lam_regressions: int = 0
    ss_big: SsBig | None = None
    lam_big_seeding_s: float = 0.0
    lam_big_moves: list[MigrationRun] = field(default_factory=list)
    lam_big_kill: FailoverRun | None = None
    big_keys: int = 0
    notes: list[str] = field(default_factory=list)


# --- the table --------------------------------------------------------------------------------------


def s(x: float) -> str:
    return f"{x:.2f} s"


def lst(xs: Sequence[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


def build_rows(res: Results) -> tuple[list[Row], list[str]]:
    """The comparison table (spark-ss and laminar rows side by side) and its notes."""
    rows: list[Row] = []
    hb = f"heartbeat timeout {HEARTBEAT_TIMEOUT_S:.0f} s, interval {HEARTBEAT_INTERVAL_S:.0f} s"
    lk, kw, kc = res.lam_kill, res.ss_kill_warm, res.ss_kill_cold
    gt, ft = f"<= {GRACEFUL_TARGET_S:.0f} s", "5-15 s"

    def add(fig: str, system: str, value: str, target: str = "-", verdict_: str = "info") -> None:
        rows.append(Row(fig, system, value, target, verdict_))

    def zero(fig: str, system: str, n: int, shown: str | None = None) -> None:
        add(fig, system, shown if shown is not None else str(n), "0", "met" if n == 0 else "FAILED")

    # 1. killed worker
    fig = "1. killed worker: detection, kill -> seen dead"
    if kw is not None:
        add(f"{fig} ({hb})", SS, s(kw.detection_s))
    if lk is not None:
        add(f"{fig} ({hb})", LAMINAR, s(lk.detection_s))
    if kw is not None:
        add("1. killed worker: recovery, start query on warm standby -> first output", SS, s(kw.recovery_s))
    if kc is not None:
        add("1. killed worker: recovery, spawn a new worker (cold) -> first output", SS, s(kc.recovery_s))
    if lk is not None:
        add("1. killed worker: recovery, forced failover launch -> first data commit", LAMINAR, s(lk.recovery_s))
    if kw is not None:
        add("1. killed worker: total, kill -> first output elsewhere (warm standby)", SS, s(kw.total_s))
    if kc is not None:
        add("1. killed worker: total, kill -> first output elsewhere (cold)", SS, s(kc.total_s))
    if lk is not None:
        total = lk.total_s
        add("1. killed worker: total, kill -> first data commit elsewhere", LAMINAR, s(total), ft,
            verdict(total, FAILOVER_TARGET_S))  # fmt: skip
    fig = "1. killed worker: unavailability, old owner's last output -> new owner's first"
    if kw is not None:
        add(f"{fig} (warm)", SS, s(kw.unavailable_s))
    if kc is not None:
        add(f"{fig} (cold)", SS, s(kc.unavailable_s))
    if lk is not None:
        add(fig, LAMINAR, s(lk.unavailable_s))
    if res.ss_kill_analysis is not None:
        a = res.ss_kill_analysis
        add("1. killed worker: batches emitted twice / duplicated rows: identical, conflicting", SS,
            f"{a.batches_emitted_twice} / {a.dup_rows_identical}, {a.dup_rows_conflicting}")  # fmt: skip
        add("1. killed worker: rows moving a key's count backwards (stale overwrite)", SS, str(a.regressions))

    # 2. planned move
    sm, lm = res.ss_moves, res.lam_moves
    if sm:
        add(f"2. planned move: stop on A -> query started on B (median of {len(sm)})", SS,
            s(median([m.stop_to_started_s for m in sm])))  # fmt: skip
    if lm:
        total = median([m.total_s for m in lm])
        add(f"2. planned move: MigrationCoordinator.run, launch -> Active (median of {len(lm)})", LAMINAR, s(total),
            gt, verdict(total, GRACEFUL_TARGET_S))  # fmt: skip
    if sm:
        add(f"2. planned move: stop on A -> first output on B (median of {len(sm)})", SS,
            s(median([m.stop_to_first_s for m in sm])))  # fmt: skip
    if lm:
        add(f"2. planned move: launch -> new owner's first data commit (median of {len(lm)})", LAMINAR,
            s(median([m.launch_to_first_data_s for m in lm])))  # fmt: skip
    fig = "2. planned move: unavailability, old owner's last output -> new owner's first"
    if sm:
        add(f"{fig} (median of {len(sm)})", SS, s(median([m.unavailable_s for m in sm])))
    if lm:
        u = median([m.unavailable_s for m in lm])
        add(f"{fig} (median of {len(lm)})", LAMINAR, s(u), gt, verdict(u, GRACEFUL_TARGET_S))
    if res.ss_move_analysis is not None:
        a = res.ss_move_analysis
        add("2. planned move: batches emitted twice / duplicated rows: identical, conflicting", SS,
            f"{a.batches_emitted_twice} / {a.dup_rows_identical}, {a.dup_rows_conflicting}")  # fmt: skip
        add("2. planned move: rows moving a key's count backwards (stale overwrite)", SS, str(a.regressions))
        add("2. planned move: final per-key count wrong: over / under / missing", SS,
            f"{a.final_over} / {a.final_under} / {a.final_missing} of {a.keys}")  # fmt: skip

    # 3. split-brain
    lz = res.lam_split
    fig = "3. split-brain: paused owner seen dead (detection)"
    for sb in res.ss_splits:
        if sb.analysis is None:
            continue
        a, v = sb.analysis, f"[{sb.variant}]"
        add(f"{fig} {v}", SS, s(sb.detection_s))
        zero(f"3. split-brain: output by the resumed zombie after takeover, batches / rows {v}", SS, a.zombie_rows,
             f"{a.zombie_batches} / {a.zombie_rows}")  # fmt: skip
        add(f"3. split-brain: micro-batches emitted twice {v}", SS, str(a.batches_emitted_twice))
        add(f"3. split-brain: duplicated (batch, key) rows: identical / conflicting {v}", SS,
            f"{a.dup_rows_identical} / {a.dup_rows_conflicting}")  # fmt: skip
        add(f"3. split-brain: rows moving a key's count backwards (stale overwrite) {v}", SS, str(a.regressions))
        add(f"3. split-brain: final per-key count (last write wins) over / under / missing {v}", SS,
            f"{a.final_over} / {a.final_under} / {a.final_missing} of {a.keys}")  # fmt: skip
        add(f"3. split-brain: query failed: zombie / newcomer {v}", SS,
            f"{'yes' if sb.zombie_error else 'no'} / {'yes' if sb.newcomer_error else 'no'}")  # fmt: skip
        add(f"3. split-brain: checkpoint usable afterwards (restart + one more file) {v}", SS,
            "yes" if sb.restart_ok else "NO")  # fmt: skip
    if lz is not None:
        add(fig, LAMINAR, s(lz.detection_s))
        zero("3. split-brain: manifests committed by the zombie after the takeover", LAMINAR,
             lz.zombie_commits_after_takeover)  # fmt: skip
        add("3. split-brain: zombie saw its revocation, after SIGCONT", LAMINAR,
            s(lz.revoked_after_s) if lz.revoked_after_s is not None else "not within 60 s")  # fmt: skip
    # 4. ~100 MB of state
    bg, lbm, lbk = res.ss_big, res.lam_big_moves, res.lam_big_kill
    big = f"{res.big_keys / 1e6:.1f}M keys"
    if bg is not None:
        add(f"4. ~100 MB: seeding {big} (produced once) -> first output", SS, s(bg.seeding_s))
    if res.lam_big_seeding_s:
        add(f"4. ~100 MB: seeding {big} (produced once) -> committed", LAMINAR, s(res.lam_big_seeding_s))
    fig = "4. ~100 MB planned move: unavailability, old owner's last output -> new owner's first"
    if bg is not None and bg.moves:
        add(f"{fig} (median of {len(bg.moves)})", SS, s(median([m.unavailable_s for m in bg.moves])))
        add(f"4. ~100 MB planned move: stop on A -> first output on B (median of {len(bg.moves)})", SS,
            s(median([m.stop_to_first_s for m in bg.moves])))  # fmt: skip
    if lbm:
        add(f"{fig} (median of {len(lbm)})", LAMINAR, s(median([m.unavailable_s for m in lbm])))
        total = median([m.total_s for m in lbm])
        add(f"4. ~100 MB planned move: launch -> Active (median of {len(lbm)})", LAMINAR, s(total), gt,
            verdict(total, GRACEFUL_TARGET_S))  # fmt: skip
        add("4. ~100 MB planned move: checkpoint bytes moved (DOWNLOADING bytes_moved, median)", LAMINAR,
            f"{median([m.download_bytes for m in lbm]) / 1e6:.2f} MB")  # fmt: skip
    if bg is not None and bg.kill is not None:
        add(f"4. ~100 MB killed worker: detection ({hb})", SS, s(bg.kill.detection_s))
        add("4. ~100 MB killed worker: recovery, start query on warm standby -> first output", SS,
            s(bg.kill.recovery_s))  # fmt: skip
        add("4. ~100 MB killed worker: total, kill -> first output elsewhere", SS, s(bg.kill.total_s))
    if lbk is not None:
        add(f"4. ~100 MB killed worker: detection ({hb})", LAMINAR, s(lbk.detection_s))
        add("4. ~100 MB killed worker: recovery, forced failover launch -> first data commit", LAMINAR,
            s(lbk.recovery_s))  # fmt: skip
        add("4. ~100 MB killed worker: total, kill -> first data commit elsewhere", LAMINAR, s(lbk.total_s), ft,
            verdict(lbk.total_s, FAILOVER_TARGET_S))  # fmt: skip
        add("4. ~100 MB killed worker: checkpoint bytes moved (DOWNLOADING bytes_moved)", LAMINAR,
            f"{lbk.download_bytes / 1e6:.2f} MB")  # fmt: skip

    # 5. the ratios (same run)
    def ratio(fig: str, lam: float | None, ss: float | None) -> None:
        if lam is None or ss is None or ss <= 0:
            add(fig, "ratio", "n/a", f"<= {RATIO_TARGET:.1f}", "not measured")
            return
        r = lam / ss
        add(fig, "ratio", f"{r:.2f} ({lam:.2f} / {ss:.2f} s)", f"<= {RATIO_TARGET:.1f}", verdict(r, RATIO_TARGET))

    def med(values: Sequence[float]) -> float | None:
        return median(values) if values else None

    ratio("5. ~1 MB planned move unavailability: laminar / spark-ss (warm standby)",
          med([m.unavailable_s for m in lm]), med([m.unavailable_s for m in sm]))  # fmt: skip
    ratio("5. ~1 MB kill recovery: laminar / spark-ss (warm standby)",
          lk.recovery_s if lk else None, kw.recovery_s if kw else None)  # fmt: skip
    ratio("5. ~100 MB planned move unavailability: laminar / spark-ss (warm standby)",
          med([m.unavailable_s for m in lbm]), med([m.unavailable_s for m in bg.moves]) if bg else None)  # fmt: skip
    ratio("5. ~100 MB kill recovery: laminar / spark-ss (warm standby)",
          lbk.recovery_s if lbk else None, bg.kill.recovery_s if bg and bg.kill else None)  # fmt: skip

    zero("3. audit_store duplicates (events), whole laminar run", LAMINAR, res.lam_audit_duplicates)
    add("3. audit_store losses / other issues, whole laminar run", LAMINAR,
        f"{res.lam_audit_losses} / {len(res.lam_audit_issues)}")  # fmt: skip
    add("3. final per-key count wrong (committed state vs truth)", LAMINAR,
        f"{res.lam_final_mismatch} of {res.lam_keys}")  # fmt: skip
    zero("3. committed rows moving a key's count backwards, whole laminar run", LAMINAR, res.lam_regressions)
    add("3. orphan output files (by a fenced owner; named by no manifest)", LAMINAR, str(res.lam_orphans))
    return rows, build_notes(res)


def build_notes(res: Results) -> list[str]:
    notes: list[str] = []
    sm, lm, lk, lz = res.ss_moves, res.lam_moves, res.lam_kill, res.lam_split
    if sm:
        notes.append(
            f"2 spark-ss: unavailability {lst([m.unavailable_s for m in sm])} s; stop -> first output "
            f"{lst([m.stop_to_first_s for m in sm])} s; the graceful stop itself {lst([m.stop_s for m in sm])} s "
            f"(waits <= {GRACEFUL_STOP_WAIT_S:.0f} s for the micro-batch in flight to complete, then query.stop()); "
            "moves " + ", ".join(f"{m.src}->{m.dst}" for m in sm)
        )
    if lm:
        phases = ", ".join(f"{ph.value} {median([m.phases.get(ph, 0.0) for m in lm]):.2f}" for ph in lm[0].phases)
        notes.append(
            f"2 laminar: unavailability {lst([m.unavailable_s for m in lm])} s; launch -> Active "
            f"{lst([m.total_s for m in lm])} s; phases (median, s): {phases}; DOWNLOADING bytes_moved "
            f"{median([m.download_bytes for m in lm]) / 1e6:.2f} MB; PLANNED: "
            f"{' | '.join(m.planned_detail for m in lm)}; new owner's restore: "
            f"{restore_summary([m.restores for m in lm])}"
        )
    if lk is not None:
        restoring = lk.phases.get(MigrationPhase.RESTORING, 0.0)
        notes.append(
            f"1 laminar: {lk.victim} -> {lk.to_node} (failover_target's pick: the warm standby); forced run launch -> "
            f"Active {lk.run_s:.2f} s (restoring {restoring:.2f} s), launch -> seal {lk.launch_to_seal_s:.2f} s; "
            f"new owner's restore: {restore_summary([lk.restores])}"
        )
    if res.ss_big is not None:
        bg = res.ss_big
        notes.append(
            f"4 spark-ss (~100 MB): unavailability {lst([m.unavailable_s for m in bg.moves])} s; stop -> first output "
            f"{lst([m.stop_to_first_s for m in bg.moves])} s; the first batch on the new worker loads the state "
            "from the checkpoint (HDFS-backed state store, the default; worker driver memory "
            f"{SS_DRIVER_MEMORY})"
        )
    if res.lam_big_moves:
        lbm = res.lam_big_moves
        notes.append(
            f"4 laminar (~100 MB): unavailability {lst([m.unavailable_s for m in lbm])} s; launch -> Active "
            f"{lst([m.total_s for m in lbm])} s; PLANNED bytes_moved {', '.join(str(m.planned_bytes) for m in lbm)}, "
            f"{' | '.join(m.planned_detail for m in lbm)}; new owner's "
            f"restore: {restore_summary([m.restores for m in lbm])}"
        )
    if res.lam_big_kill is not None:
        k = res.lam_big_kill
        notes.append(
            f"4 laminar (~100 MB) kill: {k.victim} -> {k.to_node} (failover_target's pick), launch -> Active "
            f"{k.run_s:.2f} s, unavailability {k.unavailable_s:.2f} s; new owner's restore: "
            f"{restore_summary([k.restores])}"
        )
    for sb in res.ss_splits:
        if sb.analysis is None:
            continue
        notes.append(
            f"3 spark-ss [{sb.variant}]: {sb.in_flight}; non-empty micro-batches per worker "
            f"{sb.analysis.batches_by_worker}; end marker processed: {'yes' if sb.marker_seen else 'NO'}; "
            f"zombie's error: {sb.zombie_error}; newcomer's error: {sb.newcomer_error}; restart on the checkpoint "
            f"afterwards: {'ok' if sb.restart_ok else sb.restart_error}"
        )
    if lz is not None:
        notes.append(f"3 laminar: paused {lz.in_flight}; the zombie's log after SIGCONT: REVOKED {lz.zombie_error}")
    if res.lam_audit_issues:
        notes.append("laminar audit issues: " + "; ".join(res.lam_audit_issues[:5]))
    notes.extend(res.notes)
    notes.append(
        "both: SIGKILL/SIGSTOP/SIGCONT go to the whole process tree (Python + its Spark JVM); checkpoint, source "
        "and output live on the shared local disk (with node-local checkpoints the baseline cannot recover a "
        "killed worker at all); times are wall-clock (time.time(), manifest committed_at)"
    )
    notes.append(
        "moves and kills happen at a uniformly random point (fixed seed) of the current owner's output interval, "
        "after >= 3 outputs under load; the split-brain pauses at the named points on purpose"
    )
    notes.append(
        "first output: spark-ss = a non-empty micro-batch file in the output dir; laminar = a manifest naming "
        "output. The warm standby is the fair comparison (laminar nodes are always up); cold adds JVM + "
        "SparkSession start-up"
    )
    notes.append(
        "final per-key count: spark-ss = the latest emitted row per key (a last-writer-wins upsert sink); "
        "laminar = the committed state (`committed_state`); both against the counts of the events produced"
    )
    return notes
