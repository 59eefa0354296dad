# A component handed the ledger capability must not be able to write checkpoints.
from laminar_orchestration.protocol.capabilities import LedgerWriter, checkpoint_key


def control_plane(writer: LedgerWriter) -> None:
    writer.put_checkpoint(checkpoint_key("checkpoints/00000/x.parquet"), b"", {})
