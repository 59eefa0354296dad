"""Serve moto's S3 emulation over HTTP on loopback, single-threaded.

Run as ``python tests/s3server.py --port 0 --port-file PATH`` (or ``python -m
tests.s3server`` from the repository root). With ``--port 0`` the OS picks a
free port and the launcher writes it to ``--port-file`` once the socket is
listening, so the test harness never races another process for a port.

Why a subprocess and why single-threaded: moto evaluates ``If-None-Match`` /
``If-Match`` and then stores the object as two separate Python steps. Behind a
threaded server two racing conditional PUTs can both pass the check, which
would make our concurrency tests fail for moto's sake (or pass by luck). One
request at a time makes each conditional write atomic, as it is on S3. The
server speaks HTTP/1.0 when not threaded, so every client connection closes
after its request and a waiting client never starves the others.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server


def _exit_when_orphaned(parent_pid: int) -> None:
    """Stop the server if the test process that started it dies without cleaning up."""

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, bind, publish the port, and serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path, help="where to write the bound port")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    args = parser.parse_args(argv)

    app = DomainDispatcherApplication(create_backend_app)
    # make_server rather than run_simple: same server, but we can read the port
    # the OS picked. threaded=False and processes=1 keep requests serialized.
    server = make_server(
        args.host,
        args.port,
        app,
        threaded=False,
        processes=1,
        request_handler=MotoRequestHandler,
    )
    port = server.server_port
    if args.port_file is not None:
        # Write then rename, so the harness never reads a half-written file.
        tmp = args.port_file.with_name(args.port_file.name + ".tmp")
        tmp.write_text(f"{port}\n")
        tmp.replace(args.port_file)
    print(f"moto S3 server listening on http://{args.host}:{port}", file=sys.stderr, flush=True)
    if args.parent_pid is not None:
        _exit_when_orphaned(args.parent_pid)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
