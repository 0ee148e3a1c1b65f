"""Every REST call of the SDK as a :class:`~orthoplex._transport.Call`, and the checks done
before sending (a job spec, a data path): shared by :class:`orthoplex.Client` and
:class:`orthoplex.AsyncClient`, which only send them."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from orthoplex._transport import Call, field_name
from orthoplex.errors import Invalid
from orthoplex.models import (
    Artifacts,
    ClusterOut,
    DataFile,
    DataList,
    EventPublic,
    Job,
    JobList,
    JobPublic,
    JobSpec,
    MetricPublic,
    NodeDrainIn,
    NodeDrainOut,
    PlanOut,
    TenantCreate,
    TenantList,
    TenantPublic,
    TenantUpdate,
    TokenCreate,
    TokenCreated,
)

#: a job given by id or as a job object
JobRef = int | JobPublic
#: a job spec: the model, a dict as the REST API takes it, or a YAML/JSON file
SpecLike = JobSpec | dict[str, Any] | str | Path
PAGE = 1000  # events and metrics rows per request (the API's most)


def job_id(job: JobRef) -> int:
    return job.id if isinstance(job, JobPublic) else int(job)


def _invalid(exc: ValidationError, tagged: bool = False) -> Invalid:
    errs = [(field_name(e["loc"], tagged), str(e["msg"])) for e in exc.errors()]
    return Invalid(errs[0][0], errs[0][1], errors=errs)


def spec_body(spec: SpecLike) -> dict[str, Any]:
    """The JSON body of a submission or a plan, checked against the API's ``JobSpec`` first
    (:class:`Invalid` naming the field; the server checks again, with the rules that need the
    tenant's data area)."""
    if isinstance(spec, JobSpec):
        return spec.stored()
    if isinstance(spec, str | Path):
        import yaml

        path = Path(spec)
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise Invalid("spec", f"cannot read {path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise Invalid("spec", f"{path} is not valid YAML/JSON: {exc}") from None
        if not isinstance(data, dict):
            raise Invalid("spec", f"{path}: expected a mapping (the job spec)")
        spec = data
    if not isinstance(spec, dict):
        raise Invalid("spec", f"expected a JobSpec, a dict or a file path, got {type(spec).__name__}")
    try:
        JobSpec.model_validate_json(json.dumps(spec, default=str))
    except ValidationError as exc:
        raise _invalid(exc, tagged=True) from None
    return spec


def data_path(path: str) -> str:
    """A path inside the data area as the URL carries it, checked by the server's rule
    (``workers.data_area.split_path``) so that no ``..`` is lost on the way (:class:`Invalid`)."""
    from workers.data_area import DataArea, DataPathError, split_path

    try:
        split_path(path, DataArea(root=Path(".")))
    except DataPathError as exc:
        raise Invalid("path", exc.msg) from None
    return quote(path, safe="/")


def _model(cls: type[BaseModel], /, **fields: Any) -> dict[str, Any]:
    try:
        return cls(**fields).model_dump(mode="json", exclude_unset=True)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _job(r: httpx.Response) -> Job:
    return Job.model_validate(r.json())


def _none(r: httpx.Response) -> None:
    return None


# ----------------------------------------------------------------------------------------- jobs
def submit(spec: SpecLike, idempotency_key: str | None) -> Call[Job]:
    key = idempotency_key or uuid.uuid4().hex
    return Call("POST", "/v1/jobs", _job, idempotent=True, json=spec_body(spec),
                headers={"Idempotency-Key": key})


def get(job: JobRef) -> Call[Job]:
    return Call("GET", f"/v1/jobs/{job_id(job)}", _job, idempotent=True)


def list_jobs(state: str | None, page: int | None, limit: int) -> Call[JobList]:
    params: dict[str, Any] = {"limit": limit}
    if state:
        params["state"] = state.upper()
    if page is not None:
        params["cursor"] = page

    def parse(r: httpx.Response) -> JobList:
        body = r.json()
        return JobList(items=[Job.model_validate(j) for j in body["items"]], next_cursor=body.get("next_cursor"))

    return Call("GET", "/v1/jobs", parse, idempotent=True, params=params)


def cancel(job: JobRef) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{job_id(job)}/cancel", _job, idempotent=True)


def events_page(job: JobRef, since: int, limit: int = PAGE) -> Call[list[EventPublic]]:
    return Call("GET", f"/v1/jobs/{job_id(job)}/events",
                lambda r: [EventPublic.model_validate(e) for e in r.json()], idempotent=True,
                params={"since": since, "limit": limit})


def metrics_page(job: JobRef, since_step: int, limit: int = PAGE) -> Call[list[MetricPublic]]:
    return Call("GET", f"/v1/jobs/{job_id(job)}/metrics",
                lambda r: [MetricPublic.model_validate(m) for m in r.json()], idempotent=True,
                params={"since_step": since_step, "limit": limit})


def plan(spec: SpecLike, top_k: int) -> Call[PlanOut]:
    return Call("POST", "/v1/plans", lambda r: PlanOut.model_validate(r.json()), idempotent=True,
                json=spec_body(spec), params={"top_k": top_k})


def cluster() -> Call[ClusterOut]:
    return Call("GET", "/v1/cluster", lambda r: ClusterOut.model_validate(r.json()), idempotent=True)


def artifacts(job: JobRef) -> Call[Artifacts]:
    return Call("GET", f"/v1/jobs/{job_id(job)}/artifacts", lambda r: Artifacts.model_validate(r.json()),
                idempotent=True)


def artifact_url(job: JobRef, path: str) -> str:
    return f"/v1/jobs/{job_id(job)}/artifacts/{quote(path.strip('/'), safe='/')}"


def chosen_artifacts(listing: Artifacts, prefix: str) -> list[tuple[str, str]]:
    """(artifact path, path relative to the output folder) of each file that is ``prefix`` or
    lies under it (``export`` gives the whole HF export)."""
    prefix = prefix.strip("/")
    out = []
    for f in listing.items:
        if f.path == prefix:
            out.append((f.path, Path(f.path).name))
        elif f.path.startswith(prefix + "/"):
            out.append((f.path, f.path[len(prefix) + 1:]))
    return out


# ----------------------------------------------------------------------------------------- data
def data_list(cursor: str | None = None, limit: int | None = None) -> Call[DataList]:
    params: dict[str, Any] = {}
    if cursor is not None:
        params["cursor"] = cursor
    if limit is not None:
        params["limit"] = limit
    return Call("GET", "/v1/data", lambda r: DataList.model_validate(r.json()), params=params, idempotent=True)


def data_rm(path: str) -> Call[None]:
    return Call("DELETE", f"/v1/data/{data_path(path)}", _none, idempotent=True)


def data_file(r: httpx.Response) -> DataFile:
    return DataFile.model_validate(r.json())


# ----------------------------------------------------------------------------------------- admin
def create_tenant(name: str, fields: dict[str, Any]) -> Call[TenantPublic]:
    return Call("POST", "/v1/tenants", lambda r: TenantPublic.model_validate(r.json()), idempotent=False,
                json=_model(TenantCreate, name=name, **fields))


def list_tenants(page: int | None, limit: int) -> Call[TenantList]:
    params: dict[str, Any] = {"limit": limit, **({"cursor": page} if page is not None else {})}
    return Call("GET", "/v1/tenants", lambda r: TenantList.model_validate(r.json()), idempotent=True, params=params)


def get_tenant(tenant_id: int) -> Call[TenantPublic]:
    return Call("GET", f"/v1/tenants/{int(tenant_id)}", lambda r: TenantPublic.model_validate(r.json()),
                idempotent=True)


def update_tenant(tenant_id: int, fields: dict[str, Any]) -> Call[TenantPublic]:
    return Call("PATCH", f"/v1/tenants/{int(tenant_id)}", lambda r: TenantPublic.model_validate(r.json()),
                idempotent=True, json=_model(TenantUpdate, **fields))


def create_token(tenant_id: int, name: str, expires_in_days: int | None) -> Call[TokenCreated]:
    body = _model(TokenCreate, name=name, expires_in_days=expires_in_days)
    return Call("POST", f"/v1/tenants/{int(tenant_id)}/tokens", lambda r: TokenCreated.model_validate(r.json()),
                idempotent=False, json=body)


def revoke_token(token_id: int) -> Call[None]:
    return Call("DELETE", f"/v1/tokens/{int(token_id)}", _none, idempotent=True)


def drain_node(node_id: str, deadline_s: float) -> Call[NodeDrainOut]:
    return Call("POST", f"/v1/cluster/nodes/{quote(node_id, safe='')}/drain",
                lambda r: NodeDrainOut.model_validate(r.json()), idempotent=True,
                json=_model(NodeDrainIn, deadline_s=deadline_s))


def undrain_node(node_id: str) -> Call[NodeDrainOut]:
    return Call("POST", f"/v1/cluster/nodes/{quote(node_id, safe='')}/undrain",
                lambda r: NodeDrainOut.model_validate(r.json()), idempotent=True)
