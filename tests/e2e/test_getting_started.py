"""``docs/getting-started.md`` as a newcomer runs it: every ``bash`` block but the install one, in one
shell, as written (only the port is replaced by a free one), on SQLite (and, soak tier, on PostgreSQL).

The path: ``serve --local-cluster 2x2``, a tenant and its token, a job submitted with the CLI and
followed to SUCCEEDED (``events --follow`` exits 0), a second job over curl cancelled and its SSE
stream read to its end, metrics read, the service stopped. The service log must hold no error.
Also: the job-file reference in the guide is the one the schema generates, and its example is valid.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from service.api.jobspec_reference import markdown
from service.api.process import free_port

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "getting-started.md"
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def _blocks(lang: str) -> list[tuple[str, str]]:
    return [(info.strip(), body) for kind, info, body in BLOCK.findall(GUIDE.read_text()) if kind == lang]


@pytest.mark.unit
def test_guide_reference_matches_the_schema_and_its_example_is_valid() -> None:
    from service.api.schemas import JobSpec

    text = GUIDE.read_text()
    ref = text.split("<!-- jobspec-reference:begin -->\n", 1)[1].split("<!-- jobspec-reference:end -->", 1)[0]
    assert ref == markdown(), "regenerate: python -m service.api.jobspec_reference"
    cells = [re.split(r"(?<!\\)\|", row) for row in ref.splitlines()[2:]]
    assert all(c[5].strip() for c in cells), "every field needs a meaning"
    (example,) = [body for info, body in _blocks("yaml")]
    JobSpec.model_validate(yaml.safe_load(example))


def _script(port: int) -> str:
    runnable = [body for info, body in _blocks("bash") if info != "install"]
    assert len(runnable) >= 6, "the guide lost its steps"
    return "set -euo pipefail\n" + "\n".join(runnable).replace("8470", str(port))


@pytest.mark.e2e
@pytest.mark.timeout(600)
# the guide as written runs on SQLite (a newcomer's default); the PostgreSQL run is the soak tier's
# (the CI budget): every API, controller and e2e test of the default tier runs on PostgreSQL
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.soak)])
def test_getting_started_guide_runs_as_written(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    assert shutil.which("curl"), "the guide uses curl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORTHOPLEX_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["XDG_DATA_HOME"] = str(tmp_path / "data")  # the default SQLite file and storage live here
    env["PYTHONUNBUFFERED"] = "1"
    if backend == "postgres":
        env["ORTHOPLEX_DATABASE_URL"] = request.getfixturevalue("empty_db_url")
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(["bash", "-c", _script(free_port())], cwd=work, env=env, capture_output=True,
                          text=True, timeout=540)
    log = (work / "serve.log").read_text() if (work / "serve.log").exists() else ""
    where = f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}\n--- serve.log\n{log[-6000:]}"
    assert proc.returncode == 0, where
    out = proc.stdout
    assert re.search(r"job \d+ ended: SUCCEEDED", out), where
    assert "event: end" in out and '"state":"CANCELLED"' in out, where
    assert "12/12" in out and "SUCCEEDED" in out, where  # status of the finished job
    errors = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
    assert not errors, where
