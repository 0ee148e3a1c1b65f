"""The API as a child process (``orthoplex serve --no-controller`` under uvicorn on 127.0.0.1):
started, killed with SIGKILL and restarted. Used by the crash tests and ``bench/api.py``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import httpx

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ("import typer; from service.cli import server; app = typer.Typer(); "
          "server.register(app); app(prog_name='orthoplex')")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """``orthoplex serve --no-controller`` in its own process group, ready when ``/readyz`` is 200."""

    def __init__(self, database_url: str, admin_token: str, port: int | None = None,
                 env: dict[str, str] | None = None, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "ORTHOPLEX_DATABASE_URL": database_url, "ORTHOPLEX_ADMIN_TOKEN": admin_token,
                    "ORTHOPLEX_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT), **(env or {})}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout_s: float = 120.0) -> None:
        out: IO[bytes] | int = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", LAUNCH, "serve", "--host", "127.0.0.1", "--port", str(self.port),
                 "--no-controller"],
                cwd=ROOT, env=self.env, stdout=out, stderr=out, start_new_session=True,
            )
        finally:
            if not isinstance(out, int):
                out.close()
        self.starts += 1
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"server exited with {code}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout_s} s")

    def kill(self) -> None:
        """SIGKILL the server's process group: no graceful shutdown, nothing flushed."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM (graceful), then SIGKILL after 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
