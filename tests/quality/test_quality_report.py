"""``ckpt report``: the self-contained HTML report, rendered the way a user sees it (headless
Chromium, a screenshot), on a synthetic checkpoint history written through the real store
(delta-rs, no Spark): two epochs, a recovery, an aborted checkpoint, and recorded validations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from browser import screenshot
from history import synthetic_history
from checkpoint_lib import cli
from checkpoint_lib.quality.report import write_report


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Path:
    return synthetic_history(tmp_path_factory.mktemp("report") / "w")


def test_report_holds_charts_validations_and_the_restore_log(warehouse):
    assert cli.main(["report", "payments", "--warehouse", str(warehouse)]) == 0
    page = (warehouse / "_quality" / "payments" / "report.html").read_text()
    charts = re.findall(r"<svg class=\"chart\".*?</svg>", page, re.S)
    assert len(charts) == 4
    for chart in charts:  # 5 completed checkpoints plotted, the recovery and the aborted one marked
        assert len(re.findall(r'<circle class="pt"', chart)) == 5
        assert 'class="recovery"' in chart and "epoch 2 restored 3" in chart and 'class="aborted"' in chart
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "payments-restore-c6-e2-test" in page and "PASSED" in page.upper()
    assert re.search(r"<td>2</td>.*?recover \(all\).*?<td>3</td>", page, re.S)  # epoch 2 restored checkpoint 3


def test_report_renders_in_headless_chromium(warehouse, tmp_path):
    report = write_report("payments", str(warehouse), tmp_path / "report.html")
    width, bpp, rows = screenshot(report.as_uri(), tmp_path / "shot.png", 1200, 900)
    assert (width, len(rows)) == (1200, 900)
    colours = {row[i:i + 3] for row in rows[::4] for i in range(0, len(row), bpp * 4)}
    assert len(colours) > 20, "the screenshot is blank"
    blue = bytes((0x25, 0x63, 0xEB))  # the plotted line and points
    orange = bytes((0xD9, 0x77, 0x06))  # the recovery markers
    pixels = [row[i:i + 3] for row in rows[120:700] for i in range(0, len(row), bpp)]
    assert pixels.count(blue) > 200, "no plotted points or lines are visible in the charts"
    assert pixels.count(orange) > 20, "the recovery marker is not visible"
