"""The control plane never imports torch: an API process that takes an HF job and a preset job, and
a controller round that admits both (the HF checkpoint checked from ``config.json`` and the
safetensors headers at submission and again at launch), leave ``torch`` out of ``sys.modules``.

Run in a subprocess (``control_plane_probe``): this pytest process has imported torch already.
Real parts: Postgres, the session's Ray cluster, the real API app and controller.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.controller.helpers import REPO

pytestmark = [pytest.mark.postgres, pytest.mark.cluster]


@pytest.mark.timeout(600)
def test_api_and_a_controller_round_import_no_torch(ray_cluster, migrated_db_url: str, tmp_path: Path) -> None:
    from tests.engine.hf_fixtures import make_hf_llama

    hf = make_hf_llama(tmp_path / "llama", tied=False, layers=2, vocab_size=320)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "ORTHOPLEX_LOG_FORMAT": "console"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.controller.control_plane_probe", migrated_db_url, ray_cluster.address,
         str(tmp_path / "storage"), str(hf)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=480,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # both jobs were admitted and their supervisors started: the round did launch them
    assert out["outcomes"] == {"hf": "started", "preset": "started"}, (out, proc.stderr[-3000:])
    assert out == {**out, "after_api": False, "after_round": False, "torch": False}, out
