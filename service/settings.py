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

DATA_DIR = Path(user_data_dir("orthoplex", appauthor=False))


def _default_database_url() -> str:
    return f"sqlite:///{DATA_DIR / 'orthoplex.db'}"


class Settings(BaseSettings):
    """Environment-driven configuration. Every field is ``ORTHOPLEX_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="ORTHOPLEX_", env_file=None, extra="ignore")

    database_url: str = Field(default_factory=_default_database_url, description="SQLAlchemy URL of the job store")
    ray_address: str | None = Field(default=None, description="Ray cluster address; unset = start a local Ray")
    ray_namespace: str = Field(default="orthoplex", description="Ray namespace for named actors")
    storage_path: Path = Field(default=DATA_DIR / "storage", description="Checkpoints and job artefacts")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["console", "json"] = "console"
    admin_token: str | None = Field(default=None, description="Bearer token of the administrator")
    api_url: str = Field(default="http://127.0.0.1:8470", description="Where the CLI finds the service")
    api_token: str | None = Field(default=None, description="Bearer token the CLI sends")
    gpu_type: str = Field(default="CPU", description="GPU profile of the cluster: what submissions are "
                          "fit-checked against and what the controller and the runtime plan on (e.g. H100)")
    gpus_per_node: int = Field(default=4, ge=1, le=64, description="GPUs per node of that profile")
    host: str = "127.0.0.1"
    port: int = Field(default=8470, ge=1, le=65535)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: object) -> object:
        return v.upper() if isinstance(v, str) else v


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (cached; call ``get_settings.cache_clear()`` after changing the env)."""
    return Settings()
