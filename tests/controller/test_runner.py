"""``run_in_background`` on the zero-setup SQLite store: the lease works there too; stop releases it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from service.controller.context import ControllerConfig
from service.controller.lease import LeaderLease
from service.controller.runner import config_from_env, run_in_background
from service.db.migrate import upgrade
from service.db.session import make_engine
from service.settings import Settings

pytestmark = pytest.mark.unit


def test_background_controller_on_sqlite_takes_and_releases_the_lease(tmp_path: Path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    monkeypatch.setenv("ORTHOPLEX_CONTROLLER_TICK_S", "0.1")
    monkeypatch.setenv("ORTHOPLEX_CONTROLLER_SPEC_OVERRIDES", '{"runtime": {"heartbeat_s": 1.0}}')
    settings = Settings(database_url=url, storage_path=tmp_path / "storage")
    config = config_from_env(settings)
    assert config.tick_s == 0.1 and config.spec_overrides == {"runtime": {"heartbeat_s": 1.0}}
    assert config.storage_path == tmp_path / "storage"
    first = run_in_background(settings, ControllerConfig(tick_s=0.1, lease_ttl_s=6.0), connect=False)
    engine = make_engine(url)
    other = LeaderLease(engine, "other", ttl_s=6.0)
    try:
        deadline = time.monotonic() + 20
        while not first.controller.is_leader and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.controller.is_leader and first.alive
        assert other.acquire_or_renew() is False  # SQLite: the same compare-and-set, one holder
        holder, epoch, _ = other.current()
        assert holder == first.controller.lease.holder and epoch >= 1
        while first.controller.rounds < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.controller.rounds >= 3
        epoch = other.current()[1]
    finally:
        first.stop()
    assert not first.alive
    assert other.acquire_or_renew() is True and other.epoch == epoch + 1  # released on stop: taken at once
    engine.dispose()


def test_spec_overrides_must_be_an_object(monkeypatch) -> None:
    monkeypatch.setenv("ORTHOPLEX_CONTROLLER_SPEC_OVERRIDES", "[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        config_from_env(Settings(database_url="sqlite://"))
