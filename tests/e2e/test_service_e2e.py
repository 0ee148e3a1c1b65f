"""End to end: REST → controller → runtime on Ray → a node dies → recovery → success.

A real ``orthoplex serve`` process (API on uvicorn + the controller thread) against a Postgres
database and the session Ray cluster. Two tenants submit at the same time; the scheduler's quota
sharing shows in the decisions it records; the first tenant's job loses the node it trains on,
goes RECOVERING → RUNNING and SUCCEEDS; its events and metrics are read back through the API.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api.process import free_port
from tests.controller import helpers as h

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.cluster]

ADMIN = "e2e-admin-token-0123456789"
STEPS = 100  # alpha must still be running after beta (12 steps) ends, with margin on a fast machine


class Service:
    """``orthoplex serve`` in a subprocess."""

    def __init__(self, db_url: str, ray_address: str, tmp: Path, storage: str | None = None,
                 extra_env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        env.update(
            {
                "ORTHOPLEX_DATABASE_URL": db_url,
                "ORTHOPLEX_RAY_ADDRESS": ray_address,
                "ORTHOPLEX_STORAGE_PATH": storage or str(tmp / "storage"),
                "ORTHOPLEX_ADMIN_TOKEN": ADMIN,
                "ORTHOPLEX_HOST": "127.0.0.1",
                "ORTHOPLEX_PORT": str(self.port),
                "ORTHOPLEX_CONTROLLER_TICK_S": "0.5",
                "ORTHOPLEX_CONTROLLER_LEASE_TTL_S": "5",
                "ORTHOPLEX_CONTROLLER_SPEC_OVERRIDES": json.dumps({"runtime": h.SERVICE_RUNTIME}),
            }
        )
        env.update(extra_env or {})
        env.pop("ORTHOPLEX_CONTROLLER_CRASH_AT", None)
        self.log_path = tmp / "serve.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve"],
            cwd=h.REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.admin = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)

    def wait_ready(self, timeout_s: float = 120) -> None:
        def up() -> bool:
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            try:
                return self.admin.get("/healthz").status_code == 200
            except httpx.TransportError:
                return False

        h.wait_for(up, timeout_s, "the service to answer /healthz")

    def tenant(self, name: str, quota: int) -> httpx.Client:
        r = self.admin.post("/v1/tenants", json={"name": name, "gpu_quota": quota, "weight": 1.0})
        assert r.status_code == 201, r.text
        t = self.admin.post(f"/v1/tenants/{r.json()['id']}/tokens", json={"name": "e2e"})
        assert t.status_code == 201, t.text
        token = t.json()["token"]
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _job(spec: dict[str, Any], name: str, gpus: int) -> dict[str, Any]:
    body = {k: v for k, v in spec.items() if k != "checkpoint"}
    body.update({"name": name, "min_gpus": gpus, "max_gpus": gpus, "preemptible": False})
    body["checkpoint"] = spec["checkpoint"]
    return body


@pytest.mark.timeout(900)  # a few minutes on an idle machine; far longer on a loaded one
def test_rest_to_recovery_to_success_with_two_tenants(ray_cluster, empty_db_url: str, tmp_path: Path):
    svc = Service(empty_db_url, ray_cluster.address, tmp_path)
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    try:
        svc.wait_ready()
        timings["service_up_s"] = time.monotonic() - t0
        alpha, beta = svc.tenant("alpha", quota=2), svc.tenant("beta", quota=2)

        # two tenants submit at once: alpha two non-preemptible 2-GPU jobs, beta one
        bodies = [
            (alpha, _job(h.tiny_spec(STEPS, every=4), "alpha-main", 2), "k-a1"),
            (alpha, _job(h.tiny_spec(STEPS, every=4), "alpha-second", 2), "k-a2"),
            # beta's names no recovery option: the service's defaults (alpha's re-plan after the kill
            # is the recovery story this test follows; the replica path's: tests/runtime, bench/)
            (beta, _job(h.tiny_spec(12, every=4, recovery=None), "beta-main", 2), "k-b1"),
        ]
        answers: dict[str, httpx.Response] = {}

        def submit(client: httpx.Client, body: dict[str, Any], key: str) -> None:
            # as the CLI does: a 503 (planner over its budget on a loaded box) is retried after
            # Retry-After with the same Idempotency-Key; identical concurrent specs share one search
            for _ in range(10):
                r = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
                if r.status_code != 503:
                    break
                time.sleep(float(r.headers["Retry-After"]))
            answers[key] = r

        threads = [threading.Thread(target=submit, args=b) for b in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(r.status_code == 201 for r in answers.values()), {k: r.text for k, r in answers.items()}
        alpha_ids = [answers[k].json()["id"] for k in ("k-a1", "k-a2")]
        b1 = answers["k-b1"].json()["id"]
        retry = alpha.post("/v1/jobs", json=bodies[0][1], headers={"Idempotency-Key": "k-a1"})
        assert retry.status_code == 200 and retry.json()["id"] == alpha_ids[0]

        def get(client: httpx.Client, job_id: int) -> dict[str, Any]:
            r = client.get(f"/v1/jobs/{job_id}")
            assert r.status_code == 200, r.text
            assert r.json()["state"] != "FAILED", r.json()  # fail fast instead of waiting out a timeout
            return r.json()

        def decisions(client: httpx.Client, job_id: int) -> list[dict[str, Any]]:
            r = client.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000})
            return [e["payload"] for e in r.json() if e["source"] == "scheduler" and e["type"] == "decision"]

        def alpha_running() -> list[int]:
            return [j for j in alpha_ids if get(alpha, j)["state"] == "RUNNING"]

        # the scheduler: each tenant gets its quota; alpha's other job waits although GPUs are idle
        # (non-preemptible jobs never borrow), and the recorded decision says why
        h.wait_for(
            lambda: alpha_running() and get(beta, b1)["state"] == "RUNNING",
            300,
            "both tenants' first jobs RUNNING",
        )
        timings["both_running_s"] = time.monotonic() - t0
        a1 = alpha_running()[0]
        a2 = next(j for j in alpha_ids if j != a1)
        assert [(d["kind"], d["gpus"]) for d in decisions(alpha, a1)] == [("admit", 2)]
        assert [(d["kind"], d["gpus"]) for d in decisions(beta, b1)] == [("admit", 2)]
        # no recovery options in beta's spec: the service's defaults, chosen by the control plane from
        # the plan (auto) and stored with the attempt: snapshots and warm ranks on, and why
        assert "recovery" not in get(beta, b1)["spec"]
        auto = get(beta, b1)["recovery"]
        assert auto["snapshots"] is True and auto["warm_ranks"] >= 1 and auto["reason"], auto
        assert auto["policy"] in ("replica_groups", "replan") and auto["source"] in ("rule", "plan"), auto
        started_with = [e["payload"]["recovery"] for e in beta.get(f"/v1/jobs/{b1}/events").json()
                        if e["type"] == "attempt_started"]
        assert started_with == [auto], started_with
        chosen = get(alpha, a1)["recovery"]  # alpha's named policy, with the defaults' snapshots
        assert chosen["policy"] == "replan" and chosen["snapshots"] is True, chosen
        waits = h.wait_for(lambda: decisions(alpha, a2), 30, "the queued job's recorded decision")
        assert get(alpha, a2)["state"] == "PENDING" and [d["kind"] for d in waits] == ["wait"], waits
        assert "quota" in waits[0]["reason"], waits
        cluster = svc.admin.get("/v1/cluster").json()
        assert cluster["available"] and cluster["total_gpus"] == 12 and cluster["free_gpus"] >= 4, cluster
        assert alpha.get(f"/v1/jobs/{b1}").status_code == 404  # tenants never see each other's jobs

        # alpha's second job is cancelled while queued
        r = alpha.post(f"/v1/jobs/{a2}/cancel")
        assert r.status_code == 200 and r.json()["state"] == "CANCELLED", r.text

        # kill the node alpha's job trains on, once it has checkpointed (beta's short job runs on; it
        # is not waited for first: on a loaded machine its supervisor may lag until alpha is done)
        h.wait_for(
            lambda: any(
                e["type"] == "checkpoint"
                for e in alpha.get(f"/v1/jobs/{a1}/events", params={"limit": 1000}).json()
            ),
            240,
            "a checkpoint of alpha's job",
        )
        assert get(alpha, a1)["state"] == "RUNNING", "alpha's job ended before its node could be killed"
        # where its GPUs are: its newest `placed` event, checked against the placement group Ray reports
        placed = [e["payload"] for e in alpha.get(f"/v1/jobs/{a1}/events", params={"limit": 1000}).json()
                  if e["type"] == "placed"][-1]
        nodes = set(placed["gpus_per_node"])
        in_ray = {
            n["node_id"]
            for n in svc.admin.get("/v1/cluster").json()["nodes"]
            for a in n["allocations"]
            if a["name"] == placed["placement_group"]
        }
        assert nodes and nodes == in_ray, (placed, in_ray)
        victim = sorted(nodes)[0]
        killed_at = time.monotonic()
        ray_cluster.kill_node(victim)
        h.wait_for(lambda: get(alpha, a1)["state"] == "RECOVERING", 120, "RECOVERING", interval_s=0.2)
        timings["kill_to_recovering_s"] = time.monotonic() - killed_at
        h.wait_for(lambda: get(alpha, a1)["state"] in ("RUNNING", "SUCCEEDED"), 240, "RUNNING again")
        timings["kill_to_running_s"] = time.monotonic() - killed_at
        h.wait_for(lambda: get(alpha, a1)["state"] == "SUCCEEDED", 300, "alpha's job SUCCEEDED")
        timings["total_s"] = time.monotonic() - t0
        h.wait_for(lambda: get(beta, b1)["state"] == "SUCCEEDED", 300, "beta's job SUCCEEDED")

        # events and metrics through the API. Normally the supervisor (on the head node) survives and
        # recovers inside its attempt (node_lost -> replan -> resumed); if it dies too (on a loaded
        # machine Ray's memory monitor may kill it) the controller starts attempt 2 from the newest
        # checkpoint instead. Both are a recovery; which one happened is asserted precisely.
        final = get(alpha, a1)
        assert final["gpus_allocated"] == 0
        evs = alpha.get(f"/v1/jobs/{a1}/events", params={"limit": 1000}).json()
        last = f"runtime:a{final['attempt']}"
        runtime = [e["type"] for e in evs if e["source"] == last]
        story = "; ".join(f"{e['type']}: {str(e['payload'].get('reason', ''))[:160]}" for e in evs
                          if e["source"] == last and e["type"] not in ("step", "checkpoint"))
        for kind in ("plan", "placed", "step", "checkpoint", "finished"):
            assert kind in runtime, (kind, runtime)
        print("alpha's job, attempt", final["attempt"], ":", story)
        if final["attempt"] == 1:
            for kind in ("node_lost", "replan", "resumed"):
                assert kind in runtime, (kind, story)
            # 8 GPUs are free on the surviving nodes, but the job comes back on its grant of 2
            resumed = [e["payload"] for e in evs if e["source"] == last and e["type"] == "resumed"]
            assert [r["world_size"] for r in resumed] == [2], resumed
            if chosen["policy"] == "replan":  # snapshots on by default: the re-plan restores from memory
                assert [r["source"] for r in resumed] == ["memory"], resumed
        else:
            started = [e["payload"] for e in evs if e["type"] == "attempt_started"]
            assert len(started) == final["attempt"] and "vanished" in started[-1]["reason"], started
        moves = [(e["payload"].get("from"), e["payload"].get("to")) for e in evs if e["type"] == "transition"]
        moves += [(e["payload"]["from"], e["payload"]["to"]) for e in evs if e["type"] == "attempt_started"]
        assert ("RUNNING", "RECOVERING") in moves and ("RECOVERING", "RUNNING") in moves, moves
        assert moves.count(("RUNNING", "SUCCEEDED")) == 1, moves
        rows = alpha.get(f"/v1/jobs/{a1}/metrics", params={"limit": 1000}).json()
        pairs = [(m["step"], m["epoch"]) for m in rows]
        assert len(pairs) == len(set(pairs)), pairs  # never one step twice within an attempt
        assert sorted({step for step, _ in pairs}) == list(range(1, STEPS + 1)), pairs  # every step once at least
        h.wait_for(
            lambda: not h.live_supervisors(a1) and not h.live_supervisors(b1), 60, "supervisors reaped"
        )
        print("e2e timings:", json.dumps({k: round(v, 1) for k, v in timings.items()}))
    except BaseException:
        text = "\n".join(
            line for line in svc.log_path.read_text(errors="replace").splitlines() if "service." in line
        )
        print(f"---- serve log ----\n{text[-8000:]}")
        raise
    finally:
        svc.stop()
        from service.controller.supervisors import AttemptKey, Supervisors

        sups = Supervisors()
        for job_id in range(1, 4):  # the three jobs of this test's fresh database
            for attempt in range(1, 4):
                sups.kill(AttemptKey(job_id, attempt))
