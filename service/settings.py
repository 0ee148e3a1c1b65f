"""Settings for every part of Orthoplex, read from the environment (prefix ``ORTHOPLEX_``).

The defaults need no server: the job store is an SQLite file under the user's data directory and
Ray is started locally. Production points ``ORTHOPLEX_DATABASE_URL`` at PostgreSQL and
``ORTHOPLEX_RAY_ADDRESS`` at a running cluster.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from platformdirs import user_data_dir
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers import object_store
from workers.data_area import DataArea, tenant_area

DATA_DIR = Path(user_data_dir("orthoplex", appauthor=False))


def _default_database_url() -> str:
    return f"sqlite:///{DATA_DIR / 'orthoplex.db'}"


class Settings(BaseSettings):
    """Environment-driven configuration. Every field is ``ORTHOPLEX_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="ORTHOPLEX_", env_file=None, extra="ignore")

    database_url: str = Field(default_factory=_default_database_url, description="SQLAlchemy URL of the job store")
    ray_address: str | None = Field(default=None, description="Ray cluster address; unset = start a local Ray")
    ray_namespace: str = Field(default="orthoplex", description="Ray namespace for named actors")
    ray_token_file: Path | None = Field(
        default=None, description="File holding the Ray cluster's auth token (RAY_AUTH_MODE=token); unset = "
                                  "RAY_AUTH_TOKEN_PATH, else the token of `orthoplex cluster up` when its address matches")
    allow_insecure_ray: bool = Field(
        default=False, description="Serve with a Ray cluster that answers without a token (anyone who reaches "
                                   "it runs code as the service); logged at every start, shown on /readyz")
    storage_path: Path | str = Field(
        default=DATA_DIR / "storage", description="Tenant data areas (tenants/<id>/data), checkpoints (jobs/<id>): "
        "a directory every node sees, or an object-store prefix s3://BUCKET/PREFIX (endpoint and credentials "
        "from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION; docs/storage.md)")
    shared_data_roots: dict[str, Path | str] = Field(
        default_factory=dict, description="read-only data roots every tenant may read, by name: "
        '``{"corpora": "/srv/corpora"}`` (or ``"s3://bucket/corpora"``); a job names them as ``shared:<name>/<path>``')
    data_max_files: int = Field(default=10_000, ge=1, description="files one job's data.paths may select")
    data_max_bytes: int = Field(default=16 << 30, ge=1, description="bytes one job's data.paths may select")
    upload_max_bytes: int = Field(default=1 << 30, ge=1, description="largest single upload")
    tenant_quota_bytes: int = Field(default=20 << 30, ge=1, description="bytes a tenant's data area may hold")
    tenant_quota_entries: int = Field(default=10_000, ge=1, description="files and directories a tenant's data "
                                      "area may hold")
    data_max_depth: int = Field(default=16, ge=1, le=64, description="directories an uploaded file may nest in")
    upload_max_concurrent: int = Field(default=2, ge=1, description="uploads of one tenant at once, per API "
                                       "process (more: 429)")
    mlflow_tracking_uri: str | None = Field(default=None, description="MLflow tracking URI every job logs to "
                                            "unless its spec names one (tracking.mlflow_uri); TensorBoard files "
                                            "are always written into the job's directory")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["console", "json"] = "console"
    admin_token: str | None = Field(default=None, description="Bearer token of the administrator")
    metrics_token: str | None = Field(default=None, description="Bearer token of a Prometheus scraper: "
                                      "with it (or the admin token) /metrics includes per-tenant series")
    api_url: str = Field(default="http://127.0.0.1:8470", description="Where the CLI finds the service")
    api_token: str | None = Field(default=None, description="Bearer token the CLI sends")
    gpu_type: str = Field(default="CPU", description="GPU profile of the cluster: what submissions are "
                          "fit-checked against and what the controller and the runtime plan on (e.g. H100)")
    gpus_per_node: int = Field(default=4, ge=1, le=64, description="GPUs per node of that profile")
    host: str = "127.0.0.1"
    port: int = Field(default=8470, ge=1, le=65535)

    @field_validator("storage_path", mode="before")
    @classmethod
    def _storage(cls, v: object) -> object:
        """An object-store URL stays a string (normalised; a malformed one is refused, naming what is
        wrong); anything else is a local path."""
        if isinstance(v, str) and "://" in v:
            return object_store.check_url(v)
        return Path(v) if isinstance(v, str) else v

    @field_validator("shared_data_roots", mode="before")
    @classmethod
    def _shared(cls, v: object) -> object:
        if isinstance(v, dict):
            return {k: cls._storage(r) for k, r in v.items()}
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: object) -> object:
        return v.upper() if isinstance(v, str) else v


def data_area(settings: Settings, tenant_id: int) -> DataArea:
    """Where the tenant's jobs may read (``workers.data_area``), from these settings."""
    return DataArea(root=tenant_area(settings.storage_path, tenant_id), shared=dict(settings.shared_data_roots),
                    max_files=settings.data_max_files, max_bytes=settings.data_max_bytes)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (cached; call ``get_settings.cache_clear()`` after changing the env)."""
    return Settings()
