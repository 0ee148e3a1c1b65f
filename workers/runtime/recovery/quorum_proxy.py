"""A rank's way to its job's quorum service, in a process of its own.

torchft 0.2.0's manager cannot send the job's secret (``quorum_service``), so it asks a loopback
:class:`~workers.runtime.recovery.quorum_service.LighthouseProxy` that adds it. That proxy must not
share the rank's interpreter, busy with training (a heartbeat every 100 ms must get through while the
rank computes), so :class:`ProxyProcess` runs it in a child process:
the upstream address and the secret go over its stdin (never its command line or environment), it
answers with its port, and it exits when its stdin closes (``close``, or the rank process's death).
"""

from __future__ import annotations

import json
import subprocess
import sys


class ProxyProcess:
    """Start the proxy for ``upstream`` (``http://host:port``) with ``secret``; :meth:`address` is the
    manager's ``lighthouse_addr``."""

    def __init__(self, upstream: str, secret: str, *, timeout_s: float = 60.0) -> None:
        from workers.runtime.cluster.rank_env import minimal_env

        self._proc = subprocess.Popen([sys.executable, "-m", "workers.runtime.recovery.quorum_proxy"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=minimal_env())
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"upstream": upstream, "secret": secret}) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError(f"the quorum proxy did not start (exit {self._proc.poll()})")
        self.port = int(line)

    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()  # the proxy exits on EOF
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)


def main() -> None:
    from workers.runtime.recovery.quorum_service import LighthouseProxy

    conf = json.loads(sys.stdin.readline())
    proxy = LighthouseProxy(conf["upstream"], conf["secret"])
    print(proxy.port, flush=True)
    sys.stdin.read()  # until the rank closes the pipe or dies
    proxy.close()


if __name__ == "__main__":
    main()
