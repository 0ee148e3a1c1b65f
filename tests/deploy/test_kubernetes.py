"""deploy/: every overlay renders with ``kubectl kustomize`` and every object passes offline schema
validation (Kubernetes 1.34's schemas for built-in kinds, KubeRay v1.7.0's RayCluster fields for the
RayCluster); then the facts that tie the objects together: probes on the service's real routes,
settings that exist and parse, one Ray token Secret for KubeRay and the service, the head
Service's name in ORTHOPLEX_RAY_ADDRESS, the GPU profile matching the GPU worker group, the
storage volume at ORTHOPLEX_STORAGE_PATH everywhere, requests on every container, and a PDB that
covers the two replicas."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.deploy import manifests as m

pytestmark = pytest.mark.unit

TARGETS = ["base", *(f"overlays/{o}" for o in m.overlays())]


def _one(objs: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[m.kn(o) for o in found]}"
    return found[0]


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _service_container(objs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return _one(objs, "Deployment", "orthoplex")["spec"]["template"]["spec"]["containers"][0]


def test_overlays_exist() -> None:
    assert {"production", "kueue"} <= set(m.overlays())


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_passes_its_schema(target: str) -> None:
    objs = m.render(target)
    kinds = {o["kind"] for o in objs}
    assert {"RayCluster", "Deployment", "Service", "PodDisruptionBudget", "PersistentVolumeClaim"} <= kinds
    for obj in objs:
        m.validate(obj)


@pytest.mark.parametrize("target", TARGETS)
def test_service_deployment(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    objs = m.render(target)
    dep = _one(objs, "Deployment", "orthoplex")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = _env(c)
    m.check_variables(set(env), f"{target}: Deployment/orthoplex")
    # the literal values parse as settings (types, ranges, enums)
    from service.settings import Settings

    for name, e in env.items():
        if name.startswith("ORTHOPLEX_") and "value" in e:
            monkeypatch.setenv(name, e["value"])
    settings = Settings()
    # probes: readiness on /readyz, liveness (and startup) on /healthz, both real routes, on the API's port
    port = next(p for p in c["ports"] if p["name"] == "http")
    assert port["containerPort"] == settings.port
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    paths = m.api_paths()
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] in paths, f"{probe} {get['path']} is not a route of the service"
        assert get["port"] in ("http", settings.port)
    # secrets: the database URL, the admin token and the Ray token never appear as literals
    for name in ("ORTHOPLEX_DATABASE_URL", "ORTHOPLEX_ADMIN_TOKEN", "RAY_AUTH_TOKEN", "AWS_ACCESS_KEY_ID",
                 "AWS_SECRET_ACCESS_KEY"):
        assert "secretKeyRef" in env[name].get("valueFrom", {}), f"{name} must come from a Secret"
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    # requests on the container; the API binds every interface of the pod
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    assert settings.host == "0.0.0.0"
    # the Service reaches the pods' API port
    svc = _one(objs, "Service", "orthoplex")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["http"]


@pytest.mark.parametrize("target", TARGETS)
def test_pdb_covers_the_replicas(target: str) -> None:
    objs = m.render(target)
    dep = _one(objs, "Deployment", "orthoplex")
    pdb = _one(objs, "PodDisruptionBudget")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert 1 <= pdb["spec"]["minAvailable"] < dep["spec"]["replicas"], \
        "the PDB must keep one replica serving and still allow a drain"


@pytest.mark.parametrize("target", TARGETS)
def test_raycluster_and_service_agree(target: str) -> None:
    objs = m.render(target)
    cluster = _one(objs, "RayCluster")
    spec = cluster["spec"]
    env = _env(_service_container(objs))
    # token auth: KubeRay reads the token from authOptions.secretName's key auth_token; the service
    # reads the same key of the same Secret
    assert spec["authOptions"]["mode"] == "token"
    ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (spec["authOptions"]["secretName"], m.RAY_TOKEN_KEY)
    # Ray: the same version as the image's, the head Service KubeRay makes, no ranks on the head
    import ray

    assert spec["rayVersion"] == ray.__version__
    assert env["ORTHOPLEX_RAY_ADDRESS"]["value"] == f"{cluster['metadata']['name']}{m.HEAD_SERVICE_SUFFIX}:{m.GCS_PORT}"
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    # the GPU profile the service plans on is the GPU worker group's node
    gpu_groups = [g for g in spec["workerGroupSpecs"]
                  if "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"].get("limits", {})]
    assert gpu_groups, "no GPU worker group"
    for g in gpu_groups:
        limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) == int(env["ORTHOPLEX_GPUS_PER_NODE"]["value"]), g["groupName"]
        assert g["minReplicas"] <= g.get("replicas", 0) <= g["maxReplicas"]
    from planner.profiles import lookup_gpu

    profile = lookup_gpu(env["ORTHOPLEX_GPU_TYPE"]["value"])
    assert profile is not None and profile.name != "CPU", "the GPU type must be a profile the planner knows"


@pytest.mark.parametrize("target", TARGETS)
def test_storage_and_requests_everywhere(target: str) -> None:
    objs = m.render(target)
    cluster = _one(objs, "RayCluster")
    storage = _env(_service_container(objs))["ORTHOPLEX_STORAGE_PATH"]["value"]
    pvc = _one(objs, "PersistentVolumeClaim")
    assert "ReadWriteMany" in pvc["spec"]["accessModes"], "every node mounts the storage: ReadWriteMany"
    pods = {"service": _one(objs, "Deployment", "orthoplex")["spec"]["template"], **m.pod_templates(cluster)}
    for where, template in pods.items():
        spec = template["spec"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec.get("volumes", [])
                  if "persistentVolumeClaim" in v}
        for c in spec["containers"]:
            mounts = {vm["mountPath"]: vm["name"] for vm in c.get("volumeMounts", [])}
            assert claims.get(mounts.get(storage, "")) == pvc["metadata"]["name"], \
                f"{where}/{c['name']}: the storage claim is not mounted at {storage}"
            assert {"cpu", "memory"} <= set(c.get("resources", {}).get("requests", {})), \
                f"{where}/{c['name']}: no cpu/memory requests"
            assert not (set(_env(c)) & {"ORTHOPLEX_DATABASE_URL", "ORTHOPLEX_ADMIN_TOKEN"}) or where == "service", \
                f"{where}/{c['name']}: the service's secrets do not belong on Ray nodes"
            m.check_variables(set(_env(c)), f"{target}: {where}/{c['name']}")
        assert spec["securityContext"]["runAsNonRoot"] is True


def test_kueue_overlay_labels_the_raycluster_only_there() -> None:
    label = "kueue.x-k8s.io/queue-name"
    assert _one(m.render("overlays/kueue"), "RayCluster")["metadata"]["labels"][label] == "orthoplex"
    assert label not in _one(m.render("overlays/production"), "RayCluster")["metadata"].get("labels", {})


def test_overlays_use_one_namespace() -> None:
    objs = m.render("overlays/production")
    ns = _one(objs, "Namespace")["metadata"]["name"]
    assert {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"} == {ns}


# ---------------------------------------------------------------- the validation can fail
def test_the_raycluster_schema_refuses_a_wrong_field() -> None:
    good = _one(m.render("base"), "RayCluster")
    m.validate(good)
    cases = [
        (r"spec/authOptions/mode: 'tokens' is not one of",
         lambda c: c["spec"]["authOptions"].__setitem__("mode", "tokens")),
        (r"spec/workerGroupSpecs/0: 'maxReplicas' is a required property",
         lambda c: c["spec"]["workerGroupSpecs"][0].pop("maxReplicas")),
        (r"spec/headGroupSpec: .*'rayStartParam' was unexpected",
         lambda c: c["spec"]["headGroupSpec"].__setitem__("rayStartParam", {})),
        (r"spec/workerGroupSpecs/0/replicas: '2' is not of type 'integer'",
         lambda c: c["spec"]["workerGroupSpecs"][0].__setitem__("replicas", "2")),
        # a pod template field Kubernetes does not know (checked against PodTemplateSpec)
        (r"PodTemplate/orthoplex-head: template/spec/containers/0: .*'imagePullPolicy2' was unexpected",
         lambda c: c["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
         .__setitem__("imagePullPolicy2", "Always")),
    ]
    for expected, breaks in cases:
        bad = copy.deepcopy(good)
        breaks(bad)
        with pytest.raises(AssertionError, match=expected):
            m.validate(bad)
    old = copy.deepcopy(good)
    old["spec"]["rayVersion"] = "2.51.0"
    with pytest.raises(AssertionError, match=r"2\.52\.0"):
        m.validate(old)


def test_builtin_validation_refuses_a_wrong_field() -> None:
    dep = copy.deepcopy(_one(m.render("base"), "Deployment", "orthoplex"))
    dep["spec"]["replicas"] = "two"
    with pytest.raises(AssertionError, match="replicas"):
        m.validate(dep)
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    with pytest.raises(AssertionError, match="no Kubernetes"):
        m.validate(unknown)
