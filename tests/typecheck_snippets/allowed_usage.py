# The control: correct use of each capability type-checks cleanly.
from laminar_orchestration.protocol.capabilities import CheckpointWriter, LedgerWriter, OutputCommitter
from laminar_orchestration.protocol.capabilities import checkpoint_key, ledger_key, manifest_key, sink_key


def ok(ledger: LedgerWriter, ckpt: CheckpointWriter, out: OutputCommitter) -> None:
    ledger.create(ledger_key("ledger/x.json"), b"")
    ckpt.put_checkpoint(checkpoint_key("checkpoints/00000/x.parquet"), b"", {})
    out.put_output(sink_key("sink/00000/x.parquet"), b"", {})
    out.create_manifest(manifest_key("manifests/00000/current.json"), b"")
