# The checkpoint capability only accepts checkpoint keys.
from laminar_orchestration.protocol.capabilities import CheckpointWriter, ledger_key


def batch_code(writer: CheckpointWriter) -> None:
    writer.put_checkpoint(ledger_key("ledger/partitions/00000/head.json"), b"", {})
