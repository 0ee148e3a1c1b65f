"""Run in its own process by ``test_control_plane_imports``: the API takes an HF job and a preset
job, one controller round admits both (the HF checkpoint checked again at launch), and the process
reports whether torch was imported on the way. Prints one JSON line.

Usage: ``python -m tests.controller.control_plane_probe DB_URL RAY_ADDRESS STORAGE HF_DIR``
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ADMIN = {"Authorization": "Bearer admin-secret-for-the-torch-probe"}


def main(db_url: str, ray_address: str, storage: Path, hf_dir: Path) -> dict[str, object]:
    import ray
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.controller.context import ControllerConfig
    from service.controller.loop import Controller
    from service.db.session import make_engine
    from service.settings import Settings
    from workers.data_area import tenant_area
    from workers.runtime.supervision.launch import stop_supervisor

    settings = Settings(database_url=db_url, admin_token=ADMIN["Authorization"].split()[1], storage_path=storage)
    with TestClient(create_app(settings, ApiSettings(metrics_cache_s=0, fit_check=True))) as c:
        tid = c.post("/v1/tenants", json={"name": "probe", "gpu_quota": 4}, headers=ADMIN).json()["id"]
        token = c.post(f"/v1/tenants/{tid}/tokens", json={"name": "t"}, headers=ADMIN).json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        shutil.copytree(hf_dir, tenant_area(storage, tid) / "models" / "llama")
        submitted = {}
        for name, model in (("hf", {"hf": "models/llama", "seq_len": 32}), ("preset", "tiny")):
            r = c.post("/v1/jobs", json={"name": name, "model": model, "steps": 2, "global_batch": 4}, headers=auth)
            assert r.status_code == 201, r.text
            submitted[name] = r.json()["id"]
    after_api = "torch" in sys.modules

    ray.init(address=ray_address, namespace="orthoplex", logging_level="ERROR")
    engine = make_engine(db_url)
    config = ControllerConfig(storage_path=storage, spec_overrides={"runtime": {"linger_s": 0.0}})
    ctl = Controller(engine, config, holder="probe")
    assert ctl.heartbeat(), "the probe's controller did not get the lease"
    result = ctl.tick()
    outcomes = {a.job_id: a.outcome for a in result.applied}
    after_round = "torch" in sys.modules
    for job_id in submitted.values():
        stop_supervisor(str(job_id), 1)
    return {"after_api": after_api, "after_round": after_round, "torch": "torch" in sys.modules,
            "outcomes": {name: outcomes.get(job_id) for name, job_id in submitted.items()}}


if __name__ == "__main__":
    out = main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
    print(json.dumps(out))
