"""``ckpt report``: the self-contained HTML report, rendered the way a user sees it (headless
Chromium, a screenshot), on a synthetic checkpoint history written through the real store
(delta-rs, no Spark): two epochs, a recovery, an aborted checkpoint, and recorded validations."""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

from browser import chromium
from checkpoint_lib import cli
from checkpoint_lib.core.checkpoints import CompletedCheckpoint
from checkpoint_lib.core.errors import FailureReason
from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId
from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.quality.records import ValidationLog
from checkpoint_lib.quality.report import write_report
from checkpoint_lib.quality.result import ExpectationOutcome, QualityResult



def _checkpoint(cid: int, t: float, cs_rows: int = 0) -> CompletedCheckpoint:
    acks = {SubtaskId("source", i): SubtaskAck(state={"version": cid, "next_seq": 2 * cid, "barrier_seq": 2 * cid - 1})
            for i in range(2)}
    for i in range(3):
        acks[SubtaskId("balance", i)] = SubtaskAck(
            state={"table_version": cid, "key_groups": [i * 43, min(127, i * 43 + 42)], "cursor": 2 * cid},
            state_size_bytes=1000 + 150 * cid + 10 * i, channel_state_rows=cs_rows, channel_state_bytes=64 * cs_rows,
            alignment_ms=2.5 * cid, unaligned=cs_rows > 0, duration_ms=40.0 + cid)
    return CompletedCheckpoint(cid, CheckpointKind.CHECKPOINT, t, t + 0.2 + 0.05 * cid, acks,
                               {s: t + 0.1 for s in acks})


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Path:
    w = tmp_path_factory.mktemp("report") / "w"
    root = w / "_checkpoints" / "payments"
    store = DeltaCheckpointStore.open(root, retained=10)
    t = 1_790_000_000.0
    e1 = store.begin_epoch("test", "recover (all)")
    store.record_restored(e1, None, {})
    for cid in (1, 2, 3):
        store.record_pending(cid, epoch=e1, trigger_time=t + cid)
        store.add(_checkpoint(cid, t + cid, cs_rows=cid - 1))
    store.record_pending(4, epoch=e1, trigger_time=t + 4)  # the crash: 4 never completes
    e2 = store.begin_epoch("test", "recover (all)")
    store.record_aborted(4, FailureReason.TASK_FAILURE, "epoch 1 ended before it completed", e1)
    store.record_restored(e2, 3, {})
    store.epoch = e2
    for cid in (5, 6):
        store.record_pending(cid, epoch=e2, trigger_time=t + cid)
        store.add(_checkpoint(cid, t + cid))
    result = QualityResult("payments", "restore", 6, e2, 3, "payments-restore-c6-e2-test", str(w / "_quality" / "payments" / "data_docs" / "index.html"),
                           [ExpectationOutcome("ledger", "expect_column_values_to_be_unique", "event_id", True)],
                           metrics={"valid_rows": 291, "dead_letters": 9, "sink_rows": 291, "restored_state_keys": 12},
                           started_at=t + 7, finished_at=t + 8, validation_id="v1")
    ValidationLog(root).record(result)
    return w


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


def _png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA PNG (what Chromium writes) into rows of raw pixel bytes."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, bpp, rows


def test_report_renders_in_headless_chromium(warehouse, tmp_path):
    browser = chromium()
    report = write_report("payments", str(warehouse), tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1200,900", report.as_uri()],
            capture_output=True, text=True, timeout=120,
        )
    assert shot.is_file(), proc.stderr[-2000:]
    width, bpp, rows = _png_pixels(shot)
    assert (width, len(rows)) == (1200, 900)
    colours = {row[i:i + 3] for row in rows[::4] for i in range(0, len(row), bpp * 4)}
    assert len(colours) > 20, "the screenshot is blank"
    blue = bytes((0x25, 0x63, 0xEB))  # the plotted line and points
    orange = bytes((0xD9, 0x77, 0x06))  # the recovery markers
    pixels = [row[i:i + 3] for row in rows[120:700] for i in range(0, len(row), bpp)]
    assert pixels.count(blue) > 200, "no plotted points or lines are visible in the charts"
    assert pixels.count(orange) > 20, "the recovery marker is not visible"
