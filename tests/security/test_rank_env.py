"""Rank processes do not see the service's secrets: a local Ray started by the service (as
``orthoplex serve`` does) gives its workers an environment without the admin token or the
database URL, so a job reading ``/proc/self/environ`` finds nothing to steal."""

from __future__ import annotations

import os

import pytest

from workers.runtime.cluster.rank_env import minimal_env

# values no real environment holds by chance: the Ray-worker test looks for each as a substring of every
# variable a worker sees (a 2-letter password, "pw", turned up inside some other value once, 2026-12-06)
SECRETS = {"ORTHOPLEX_ADMIN_TOKEN": "admin-secret-xyz", "ORTHOPLEX_DATABASE_URL": "postgresql://u:pg-secret-q7v@db/x",
           "ORTHOPLEX_METRICS_TOKEN": "scrape-xyz", "PGPASSWORD": "pg-secret-q7v"}


@pytest.mark.unit
def test_minimal_env_drops_secrets_keeps_the_rest() -> None:
    env = minimal_env({**SECRETS, "PATH": "/bin", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "ray",
                       "OMP_NUM_THREADS": "1", "ORTHOPLEX_LOG_LEVEL": "INFO"})
    assert env == {"PATH": "/bin", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "ray", "OMP_NUM_THREADS": "1",
                   "ORTHOPLEX_LOG_LEVEL": "INFO"}


_PROBE = """
import json, sys
import ray
from service.controller.runner import connect_ray
from service.settings import Settings

assert connect_ray(Settings(database_url="sqlite:///unused.db"))
try:
    @ray.remote(num_cpus=0)
    def environ():
        with open("/proc/self/environ", "rb") as f:
            raw = f.read().decode(errors="replace")
        return dict(kv.split("=", 1) for kv in raw.split("\\0") if "=" in kv)

    print(json.dumps(ray.get(environ.remote(), timeout=120)))
finally:
    ray.shutdown()
"""


@pytest.mark.cluster
def test_local_ray_workers_get_no_service_secrets() -> None:
    """A service process (its own, so no Ray connection of the test session is reused) holding the
    secrets starts a local Ray through ``connect_ray``; a Ray worker's ``/proc/self/environ`` has none."""
    import json
    import subprocess
    import sys

    env = {**os.environ, **SECRETS}
    env.pop("ORTHOPLEX_RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not set(SECRETS) & set(seen), sorted(set(SECRETS) & set(seen))
    assert not any(v in "\0".join(seen.values()) for v in SECRETS.values())


@pytest.mark.unit
def test_the_object_store_credentials_reach_the_ranks() -> None:
    """Ranks write checkpoints to s3:// storage themselves: the standard AWS variables stay."""
    creds = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t",
             "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_DEFAULT_REGION": "us-east-1"}
    assert minimal_env({**SECRETS, **creds}) == creds
