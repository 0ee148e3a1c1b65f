"""compose.yaml: every variable it sets is a real setting (or a documented AWS/Ray variable, or one
its image documents), the values parse as settings, every address, port and volume meets the
service that answers there, secrets come only from the environment, and the service waits for a
healthy database (and Ray head, and S3 server). Docker is not available here: nothing is started."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import make_url

from tests.deploy.manifests import ROOT, api_paths, check_variables

pytestmark = pytest.mark.unit

#: what the user provides (in the environment or .env); values here are only for the test
SECRETS = {"POSTGRES_PASSWORD": "pw-compose-test", "RAY_AUTH_TOKEN": "ray-compose-test",
           "ORTHOPLEX_ADMIN_TOKEN": "admin-compose-test"}
#: the variables the official postgres image documents (its page on Docker Hub, "Environment Variables")
POSTGRES_IMAGE_VARIABLES = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "POSTGRES_INITDB_ARGS",
                            "POSTGRES_INITDB_WALDIR", "POSTGRES_HOST_AUTH_METHOD", "PGDATA"}
_VAR = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(?::([?-])([^}]*))?\}")


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}``."""
    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op == "-":
            return arg
        raise KeyError(f"${{{name}}} is required: {arg}")
    return _VAR.sub(one, value)


def _raw() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def _resolved(env: dict[str, str] | None = None) -> dict[str, Any]:
    env = SECRETS if env is None else env

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return _interpolate(x, env) if isinstance(x, str) else x
    return walk(_raw())


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def _flag(command: list[str], name: str) -> str:
    for i, arg in enumerate(command):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name:
            return command[i + 1]
    raise AssertionError(f"{name} missing from {command}")


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> named volume"""
    return {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", [])}


def test_services_and_images() -> None:
    c = _resolved()
    assert set(c["services"]) == {"postgres", "s3", "ray-head", "orthoplex"}
    head, svc = c["services"]["ray-head"], c["services"]["orthoplex"]
    # one image for the Ray head and the service: the same Ray, Python and engine on both sides
    assert head["image"] == svc["image"] and head["build"] == svc["build"] == {"context": ".",
                                                                              "args": {"TORCH_VARIANT": "cpu"}}
    assert (ROOT / "Dockerfile").exists()
    for name, s in c["services"].items():
        assert re.search(r":[\w.\-]+$", s["image"]) and not s["image"].endswith(":latest"), \
            f"{name}: pin the image tag"


def test_every_variable_is_real(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _resolved()
    for name in ("orthoplex", "ray-head"):
        check_variables(set(_env(c["services"][name])), f"compose.yaml service {name}")
    assert set(_env(c["services"]["postgres"])) <= POSTGRES_IMAGE_VARIABLES
    assert not _env(c["services"]["s3"])
    # the values parse as the service's settings
    from service.settings import Settings

    for k, v in _env(c["services"]["orthoplex"]).items():
        if k.startswith("ORTHOPLEX_"):
            monkeypatch.setenv(k, v)
    settings = Settings()
    assert settings.admin_token == SECRETS["ORTHOPLEX_ADMIN_TOKEN"] and settings.host == "0.0.0.0"


def test_secrets_only_from_the_environment() -> None:
    raw = _raw()
    for svc, name in [("postgres", "POSTGRES_PASSWORD"), ("orthoplex", "ORTHOPLEX_ADMIN_TOKEN"),
                      ("orthoplex", "RAY_AUTH_TOKEN"), ("ray-head", "RAY_AUTH_TOKEN")]:
        value = _env(raw["services"][svc])[name]
        assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]*\}", value), f"{svc}.{name} must be required from the environment"
    url = _env(raw["services"]["orthoplex"])["ORTHOPLEX_DATABASE_URL"]
    assert "${POSTGRES_PASSWORD:?" in url
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):
        _resolved({k: v for k, v in SECRETS.items() if k != "POSTGRES_PASSWORD"})


def test_the_database_url_meets_postgres() -> None:
    c = _resolved()
    pg = c["services"]["postgres"]
    pg_env = _env(pg)
    url = make_url(_env(c["services"]["orthoplex"])["ORTHOPLEX_DATABASE_URL"])
    assert url.drivername == "postgresql+psycopg"
    assert (url.host, url.port or 5432) == ("postgres", 5432)  # the image's server listens on 5432
    assert (url.username, url.password, url.database) == (pg_env["POSTGRES_USER"], SECRETS["POSTGRES_PASSWORD"],
                                                          pg_env["POSTGRES_DB"])
    # the image keeps its data in PGDATA, /var/lib/postgresql/data up to major version 17
    major = int(re.search(r":(\d+)", pg["image"]).group(1))
    assert major <= 17 and _mounts(pg).get(pg_env.get("PGDATA", "/var/lib/postgresql/data")) == "pgdata"
    test = pg["healthcheck"]["test"]
    assert "pg_isready" in test and f"--username={pg_env['POSTGRES_USER']}" in test \
        and f"--dbname={pg_env['POSTGRES_DB']}" in test


def test_ray_and_s3_addresses_meet_their_servers() -> None:
    c = _resolved()
    head, svc, s3 = c["services"]["ray-head"], c["services"]["orthoplex"], c["services"]["s3"]
    env = _env(svc)
    host, port = env["ORTHOPLEX_RAY_ADDRESS"].rsplit(":", 1)
    assert host == "ray-head" and port == _flag(head["command"], "--port")
    assert "--head" in head["command"] and "--block" in head["command"]
    assert int(env["ORTHOPLEX_GPUS_PER_NODE"]) == int(_flag(head["command"], "--num-gpus"))
    from planner.profiles import lookup_gpu

    assert lookup_gpu(env["ORTHOPLEX_GPU_TYPE"]) is not None, "a GPU profile the planner knows"
    assert _env(head)["RAY_AUTH_MODE"] == env["RAY_AUTH_MODE"] == "token"
    assert _env(head)["RAY_AUTH_TOKEN"] == env["RAY_AUTH_TOKEN"]
    assert _flag(head["healthcheck"]["test"], "--address").endswith(f":{port}")
    s3_port = _flag(s3["entrypoint"], "-p")
    assert _flag(s3["entrypoint"], "-H") == "0.0.0.0"
    for name in ("orthoplex", "ray-head"):
        assert _env(c["services"][name])["AWS_ENDPOINT_URL"] == f"http://s3:{s3_port}", name
    assert f"127.0.0.1:{s3_port}/" in " ".join(s3["healthcheck"]["test"])
    # Ray's dashboard (8265 unless --dashboard-port says otherwise) is what the head publishes
    assert [p.rsplit(":", 1)[1] for p in head["ports"]] == ["8265"]


def test_the_service_port_and_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _resolved()
    svc = c["services"]["orthoplex"]
    env = _env(svc)
    port = env["ORTHOPLEX_PORT"]
    assert [p.rsplit(":", 1)[1] for p in svc["ports"]] == [port]
    probe = " ".join(svc["healthcheck"]["test"])
    m = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", probe)
    assert m and m.group(1) == port and m.group(2) == "/readyz" and "/readyz" in api_paths()


def test_storage_is_one_volume_at_the_storage_path() -> None:
    c = _resolved()
    path = _env(c["services"]["orthoplex"])["ORTHOPLEX_STORAGE_PATH"]
    volumes = {_mounts(c["services"][n]).get(path) for n in ("orthoplex", "ray-head")}
    assert volumes == {"storage"}, f"the service and the Ray head must share one volume at {path}"
    used = {v for s in c["services"].values() for v in _mounts(s).values()}
    assert used == set(c["volumes"])


def test_the_service_waits_for_its_dependencies() -> None:
    c = _resolved()
    deps = c["services"]["orthoplex"]["depends_on"]
    for name in ("postgres", "ray-head", "s3"):
        assert deps[name]["condition"] == "service_healthy", name
        assert c["services"][name]["healthcheck"]["test"], f"{name} needs a healthcheck to be waited for"
