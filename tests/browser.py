"""A headless Chromium for the tests that look at a page the way a user does.

``make setup`` installs no browser. The first test that needs one calls :func:`chromium`: it is
found on ``PATH``; else, on Debian as root, installed with apt-get (the ``chromium`` package, as
the Dockerfile does); else the test is skipped and says why and how to get one.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

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
