"""Knobs of the API that ``service.settings.Settings`` does not carry (prefix ``ORTHOPLEX_API_``).

The cluster's GPU profile, which the submission path plans against to refuse jobs that cannot fit
on any GPU count in their ``min_gpus..max_gpus`` range, is a service setting
(``ORTHOPLEX_GPU_TYPE``, ``ORTHOPLEX_GPUS_PER_NODE``): the controller and the runtime plan on it too.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ORTHOPLEX_API_", env_file=None, extra="ignore")

    max_body_bytes: int = Field(default=1 << 20, ge=1024, description="larger request bodies get 413")
    fit_check: bool = Field(default=True, description="plan every submitted spec; 422 when nothing fits")
    plan_timeout_s: float = Field(default=2.0, gt=0, description="fit-check budget (then 503, retry)")
    dryrun_timeout_s: float = Field(default=10.0, gt=0, description="POST /v1/plans budget (then 422)")
    sse_poll_s: float = Field(default=0.5, gt=0, description="how often an event stream polls the store")
    sse_max_s: float = Field(default=3600.0, gt=0, description="an event stream ends after this long")
    sse_recheck_s: float = Field(default=30.0, gt=0, le=30.0,
                                 description="an open stream re-checks its token this often (revoked: it ends)")
    sse_max_per_tenant: int = Field(default=8, ge=1, description="open event streams per tenant per process (429)")
    cluster_timeout_s: float = Field(default=3.0, gt=0, description="time budget for asking Ray")
    metrics_cache_s: float = Field(default=5.0, ge=0, description="/metrics reads the store at most this often")
