"""moto's S3 emulation over HTTP on loopback, one request at a time in moto, and the one launcher for it.

`start_s3_server` is what the tests (``tests/conftest.py``), the benchmarks
and the chaos suite use: it runs this module as a subprocess
(``python -m laminar_dev.s3server --port 0 --port-file PATH``), waits until it
answers, and sets fake AWS credentials in ``os.environ`` while it runs. With
``--port 0`` the OS picks a free port and the server writes it to
``--port-file`` once the socket is listening, so nobody races another process
for a port.

Why one request at a time in moto: moto evaluates ``If-None-Match`` /
``If-Match`` and then stores the object as two separate Python steps; two
racing conditional PUTs could both pass the check, which would make our
concurrency tests fail for moto's sake (or pass by luck). One request at a
time makes each conditional write atomic, as it is on S3 (`SerializedApp`).
Why a thread per connection all the same: the socket I/O stays outside that
one-at-a-time section, so a client that stops mid-request (a paused zombie
process, a slow upload) holds up only its own connection, never the server.
The threads cost CPU: ~4.8 ms a request against ~3.7 ms answering one
connection at a time, with 32 client connections open.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import boto3
from botocore.config import Config

__all__ = [
    "FAKE_AWS_ENV",
    "AccessKey",
    "SerializedApp",
    "create_iam_user",
    "enable_auth",
    "fake_aws_environ",
    "iam_pattern_match",
    "main",
    "start_s3_server",
]

STARTUP_TIMEOUT_S = 30.0

#: Fake credentials: moto accepts anything, and they guarantee that nothing run
#: against the server can touch a real AWS account whatever the environment holds.
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    # No instance-metadata probing (slow timeouts when not on EC2).
    "AWS_EC2_METADATA_DISABLED": "true",
}
_CLEARED_AWS_ENV = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


@contextlib.contextmanager
def fake_aws_environ(workdir: Path) -> Iterator[None]:
    """Fake credentials, no endpoint or profile and no ~/.aws files in os.environ while inside (children inherit)."""
    changes: dict[str, str | None] = dict(FAKE_AWS_ENV)
    changes.update(dict.fromkeys(_CLEARED_AWS_ENV))
    changes["AWS_CONFIG_FILE"] = str(workdir / "no-aws-config")
    changes["AWS_SHARED_CREDENTIALS_FILE"] = str(workdir / "no-aws-credentials")
    saved = {name: os.environ.get(name) for name in changes}
    try:
        _set_environ(changes)
        yield
    finally:
        _set_environ(saved)


def _set_environ(values: Mapping[str, str | None]) -> None:
    """Set each variable of `values` in os.environ; None unsets it."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _wait_for_server(proc: subprocess.Popen[bytes], port_file: Path, log: Path) -> str:
    """The server's URL once it answers HTTP; RuntimeError with its log if it dies or hangs."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    url: str | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        if url is None and port_file.exists():
            url = f"http://127.0.0.1:{int(port_file.read_text())}"
        if url is not None:
            try:
                # An unsigned GET / is ListBuckets; it also warms up moto's S3 app.
                with urllib.request.urlopen(url + "/", timeout=5):
                    return url
            except urllib.error.HTTPError:
                return url  # any HTTP answer means it is serving
            except OSError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"moto server did not answer within {STARTUP_TIMEOUT_S}s:\n{log.read_text(errors='replace')}")


@dataclass(frozen=True)
class AccessKey:
    """An IAM user's access key on the server."""

    user: str
    access_key_id: str
    secret_access_key: str

    def environ(self) -> dict[str, str]:
        """The environment variables that make boto3 in a process use this key (and no session token)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}

    def client(self, service: Literal["s3", "iam"], endpoint: str) -> Any:
        """A boto3 client of `service` at `endpoint` signing with this key only."""
        session = boto3.session.Session(
            aws_access_key_id=self.access_key_id, aws_secret_access_key=self.secret_access_key, region_name="us-east-1"
        )
        # Path-style: a loopback endpoint has no bucket subdomains.
        return session.client(service, endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"}))


#: The administrator `enable_auth` creates: allowed everything, like an account's root.
ADMIN_USER = "laminar-admin"


def create_iam_user(endpoint: str, admin: AccessKey | None, user: str, policy: Mapping[str, Any]) -> AccessKey:
    """Create IAM user `user` with `policy` inline (signed by `admin`, or the fake keys before auth is on)."""
    if admin is not None:
        iam = admin.client("iam", endpoint)
    else:
        iam = AccessKey("", FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"], FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"]).client(
            "iam", endpoint
        )
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName=f"{user}-policy", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return AccessKey(user, key["AccessKeyId"], key["SecretAccessKey"])


def enable_auth(endpoint: str) -> AccessKey:
    """Create an administrator and switch authentication on; returns the administrator's key.

    From then on the server checks every request's signature and its IAM
    Action/Resource against the signer's policies (moto does not evaluate
    Condition blocks or bucket policies).
    """
    admin = create_iam_user(
        endpoint,
        None,
        ADMIN_USER,
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]},
    )
    # Not form-encoded: moto reads the raw body as the number of requests still allowed unsigned.
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
    return admin


@contextlib.contextmanager
def start_s3_server(workdir: Path, *, auth: bool = False) -> Iterator[str]:
    """Run the server on a free loopback port (its port file and log in `workdir`); yield its endpoint URL.

    While inside, os.environ holds fake AWS credentials (`fake_aws_environ`),
    so boto3 clients here and in child processes need no setup. With `auth`,
    the server enforces signatures and IAM policies (`enable_auth`) and
    os.environ holds the administrator's key instead (no session token): give
    each role's process its own key (`create_iam_user`, `AccessKey.environ`).
    The server exits with this process even if it is killed without cleaning up.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port_file, log = workdir / "port", workdir / "server.log"
    with fake_aws_environ(workdir):
        with open(log, "wb") as log_fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "laminar_dev.s3server", "--port", "0", "--port-file", str(port_file),
                 "--parent-pid", str(os.getpid())],
                stdin=subprocess.DEVNULL,
                # To a file, never a pipe: nobody drains a pipe and a full one would freeze the server.
                stdout=log_fh,
                stderr=subprocess.STDOUT,
                cwd=Path(__file__).resolve().parent.parent,  # where `laminar_dev` is importable from
            )  # fmt: skip
        try:
            endpoint = _wait_for_server(proc, port_file, log)
            if not auth:
                yield endpoint
            else:
                admin = enable_auth(endpoint)
                os.environ.pop("AWS_SESSION_TOKEN", None)  # restored by `fake_aws_environ`
                os.environ.update(admin.environ())
                yield endpoint
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _exit_when_orphaned(parent_pid: int) -> None:
    """Stop the server if the test process that started it dies without cleaning up."""

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def iam_pattern_match(pattern: str, value: str) -> re.Match[str] | None:
    """IAM's matching of an Action or Resource pattern: `*` any run of characters (`/` included),
    `?` exactly one character, everything else literal, the whole value."""
    regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, value, re.DOTALL)


def _match_patterns_as_iam_does() -> None:
    """Make the server's policy checks use `iam_pattern_match`.

    moto turns a pattern into a regular expression by replacing `*` with `.*` only, so a `?` is a
    regex quantifier (the storage policies' five-character partition segment, ``?????``, would be
    a syntax error) and a `.` matches any character. The storage policies rely on `?` to keep a
    key from spanning segments (`keys.PARTITION_SEGMENT_PATTERN`), so the emulation must honour it.
    """
    from moto.iam import access_control

    access_control.IAMPolicyStatement._match = staticmethod(iam_pattern_match)  # type: ignore[method-assign, assignment]


#: A connection idle this long mid-request is closed (its thread freed): a paused client is not waited for.
CONNECTION_TIMEOUT_S = 60.0


class SerializedApp:
    """A WSGI app called by one request at a time; bodies are read and responses collected outside.

    The request body is read whole before the lock and the response iterable drained inside it, so
    the app's check-then-store steps never interleave and no socket wait ever happens under the lock.
    """

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        stream = environ["wsgi.input"]
        if environ.get("wsgi.input_terminated"):  # chunked: the server's stream ends at the body's end
            body = stream.read()
        else:
            body = stream.read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        started: list[tuple[Any, ...]] = []
        chunks: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            started[:] = [(status, headers, exc_info)]
            return chunks.append

        with self.lock:
            result = self.app(environ, capture)
            try:
                chunks.extend(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        start_response(*started[0])
        return chunks


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, bind, publish the port, and serve until killed."""
    # Imported here: only the server process needs moto, not whoever starts it.
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    _match_patterns_as_iam_does()

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path, help="where to write the bound port")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    args = parser.parse_args(argv)

    class HostCachingDispatcher(DomainDispatcherApplication):
        """moto's dispatcher, remembering which backend serves a host.

        moto lists its package directory and tries every service's URL patterns on each request
        (a few milliseconds, most of a small request's time); the answer for a host never changes.
        """

        def __init__(self) -> None:
            super().__init__(create_backend_app)
            self.backend_of_host: dict[str | None, Any] = {}

        def get_backend_for_host(self, host: str | None) -> Any:
            if host not in self.backend_of_host:
                self.backend_of_host[host] = super().get_backend_for_host(host)
            return self.backend_of_host[host]

    class TimingOutHandler(MotoRequestHandler):
        timeout = CONNECTION_TIMEOUT_S

    # make_server rather than run_simple: same server, but we can read the port the OS picked. A
    # thread per connection for the I/O; `SerializedApp` keeps moto itself one request at a time.
    server = make_server(
        args.host,
        args.port,
        SerializedApp(HostCachingDispatcher()),
        threaded=True,
        request_handler=TimingOutHandler,
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
