"""A headless Chromium for the tests that look at a page the way a user does, and its screenshots
as pixels (:func:`screenshot`).

``make setup`` installs no browser. The first test that needs one calls :func:`chromium`: it is
found on ``PATH``; else, on Debian as root, installed with apt-get (the ``chromium`` package, as
the Dockerfile does); else the test is skipped and says why and how to get one.
"""

from __future__ import annotations

import functools
import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

NAMES = ("chromium", "chromium-browser", "google-chrome")


def _found() -> str | None:
    return next((path for name in NAMES if (path := shutil.which(name))), None)


@functools.cache
def _install() -> str:
    """Install Debian's chromium; '' when done, else why not."""
    if shutil.which("apt-get") is None:
        return "no apt-get on this machine"
    if os.geteuid() != 0:
        return "installing it needs root (apt-get)"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True, "timeout": 900}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    proc = subprocess.run(cmd, **quiet)
    if proc.returncode != 0:  # an image with empty package lists: fetch them, once
        subprocess.run(["apt-get", "update"], **quiet)
        proc = subprocess.run(cmd, **quiet)
    return "" if proc.returncode == 0 else f"apt-get install chromium failed: {proc.stderr.strip()[-300:]}"


def chromium() -> str:
    """The path of a Chromium to run headless, installing it if this machine can; else skip."""
    path = _found()
    if path is None:
        why = _install()
        path = _found()
        if path is None:
            pytest.skip(f"no Chromium for the screenshot ({why or 'installed, yet not on PATH'}); "
                        f"install one of {', '.join(NAMES)} to run this test")
    return path


def screenshot(url: str, out: Path, width: int, height: int, *flags: str) -> tuple[int, int, list[bytes]]:
    """``url`` rendered by headless Chromium at ``width`` x ``height``: (width, bytes per pixel,
    rows of raw pixel bytes)."""
    browser = chromium()
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", *flags,
             f"--user-data-dir={profile}", f"--screenshot={out}", f"--window-size={width},{height}", url],
            capture_output=True, text=True, timeout=120,
        )
    assert out.is_file(), proc.stderr[-2000:]
    return png_pixels(out)


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
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
