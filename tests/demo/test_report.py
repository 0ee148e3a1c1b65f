"""The demo's closing report, built from API-shaped events and metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.demo.report import JobReport, save_loss_png, terminal_loss_chart

pytestmark = pytest.mark.unit


def _events() -> list[dict]:
    lay_a = {"tp": 2, "pp": 2, "cp": 1, "dp": 2, "vpp": 1}
    lay_b = {"tp": 2, "pp": 1, "cp": 1, "dp": 2, "vpp": 1}
    return [
        {"id": 1, "type": "plan", "payload": {"layout": lay_a, "short": "tp2·pp2·cp1·dp2"}},
        {"id": 2, "type": "replan", "payload": {"old": lay_a, "new": lay_b, "decision": "replan"}},
        {"id": 3, "type": "recovery", "payload": {"cause": "node_lost", "from_step": 4,
                                                  "phases": {"detect": 1.0, "plan": 0.5, "place": 0.5,
                                                             "start": 2.0, "load": 1.0, "first_step": 1.0},
                                                  "total_s": 6.0}},
    ]


def test_report_from_api_rows(tmp_path: Path) -> None:
    metrics = [{"step": s, "epoch": 1, "loss": 5.0 - 0.1 * s} for s in range(1, 7)]
    metrics += [{"step": 5, "epoch": 2, "loss": 4.45}]  # a step redone after the recovery
    rep = JobReport.from_api({"id": 3, "name": "j", "state": "SUCCEEDED"}, _events(), metrics, "alpha")
    assert rep.steps == [1, 2, 3, 4, 5, 6]
    assert rep.losses[4] == pytest.approx(4.45)  # the latest attempt's value wins
    assert rep.layouts == ["tp2·pp2·cp1·dp2", "tp2·pp1·cp1·dp2"]
    assert rep.gpu_seconds_lost == pytest.approx(8 * 6.0)
    png = save_loss_png([rep], tmp_path / "loss.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    chart = terminal_loss_chart([rep], width=60, height=12)
    assert "loss" in chart and len(chart.splitlines()) >= 10
