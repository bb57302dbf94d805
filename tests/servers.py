"""Throwaway real servers for tests: PostgreSQL (``initdb`` + ``pg_ctl`` from Debian's ``postgresql``
package) on a free loopback port, stopped at the end of the session. When the binaries are missing
the tests that need it skip with a message naming the package; ``.ci/run`` installs it, so CI runs them.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from fakes.live import free_port



def postgres_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


class Postgres:
    """A private cluster: ``url`` is a SQLAlchemy URL (psycopg) of database ``infer``."""

    def __init__(self) -> None:
        initdb, pg_ctl = postgres_bin("initdb"), postgres_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise FileNotFoundError("PostgreSQL server binaries not found: apt-get install postgresql")
        self.pg_ctl = pg_ctl
        self.dir = Path(tempfile.mkdtemp(prefix="infer-pg-"))
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to the postgres account
            shutil.chown(self.dir, self.user)
        self._run([initdb, "-D", str(self.dir / "data"), "-U", self.user, "--auth=trust", "-E", "UTF8"])
        self.opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off"
        self.resume()
        self._run([postgres_bin("createdb") or "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user,
                   "infer"])
        self.url = f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/infer"

    def _run(self, args: list[str]) -> None:
        if os.geteuid() == 0:
            args = ["runuser", "-u", self.user, "--", *args]
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {done.stderr[-1000:]}")

    def pause(self) -> None:
        """An outage: the server stops at once (clients' connections are cut), its data kept."""
        self._run([self.pg_ctl, "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop"])

    def resume(self) -> None:
        self._run([self.pg_ctl, "-D", str(self.dir / "data"), "-o", self.opts, "-l", str(self.dir / "log"), "-w",
                   "start"])

    def stop(self) -> None:
        try:
            self.pause()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def wait_for(predicate, timeout: float = 10.0, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


class Redis:
    """A throwaway ``redis-server`` on a free loopback port (Debian's ``redis-server`` package)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server not found: apt-get install redis-server")
        self.binary = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="infer-redis-"))
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.resume()

    def resume(self) -> None:
        self.process = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                         "--appendonly", "no", "--dir", str(self.dir)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_for(self._up, timeout=15):
            self.stop()
            raise RuntimeError("redis-server did not start")

    def pause(self) -> None:
        """An outage: the server is gone (what it held goes with it, as after a crash)."""
        self.process.kill()
        self.process.wait(timeout=10)

    def _up(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
