"""The race rows of docs/reliability.md (``make chaos``): every test marked ``race`` (two attempts
or writers alive at once: zombies, racing recoveries, a recovery during a commit, a savepoint of a
running pipeline, abort against completion, maintenance against a running pipeline, ...) is run,
slow ones included, and listed with its outcome. Each of those tests compares the outputs (or the
control tables) with what exactly-once allows, so "passed" means tried, nothing lost, nothing twice.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- BEGIN make chaos races: generated, do not edit -->"
END = "<!-- END make chaos races -->"


@dataclass(frozen=True)
class RaceOutcome:
    test: str
    """``path::name[params]``, relative to the repository."""
    passed: bool
    seconds: float
    what: str


def run(extra: list[str] | None = None) -> list[RaceOutcome]:
    """Run every race test (a pytest child process: its own Spark) and return the outcomes."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "races.xml"
        subprocess.run([sys.executable, "-m", "pytest", "tests", "-m", "race", "-o", "addopts=", "-q",
                        "-p", "no:cacheprovider", f"--junitxml={xml}", *(extra or [])], cwd=ROOT, check=False)
        return parse(xml)


def parse(xml: Path) -> list[RaceOutcome]:
    out = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        if case.find("skipped") is not None:
            continue
        path = case.get("classname", "").replace(".", "/") + ".py"
        name = case.get("name", "")
        failed = case.find("failure") is not None or case.find("error") is not None
        out.append(RaceOutcome(f"{path}::{name}", not failed, float(case.get("time", 0)), describe(path, name)))
    return out


def describe(path: str, name: str) -> str:
    """The first sentence of the test's docstring, else its name in words."""
    function = name.split("[", 1)[0]
    try:
        tree = ast.parse((ROOT / path).read_text())
    except (OSError, SyntaxError):
        tree = None
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.FunctionDef) and node.name == function:
            doc = " ".join((ast.get_docstring(node) or "").split())
            if doc:
                return doc.split(". ", 1)[0].rstrip(".") + (f" ({name.split('[', 1)[1][:-1]})" if "[" in name else "")
    return function.removeprefix("test_").replace("_", " ") + (f" ({name.split('[', 1)[1][:-1]})" if "[" in name else "")


def render(outcomes: list[RaceOutcome]) -> str:
    passed = sum(o.passed for o in outcomes)
    lines = [f"{len(outcomes)} race tests run, {passed} passed (tried; nothing lost, nothing twice), "
             f"{len(outcomes) - passed} failed; {sum(o.seconds for o in outcomes) / 60:.0f} min.", "",
             "| race | tried | lost | duplicated | time | test |", "|---|---|---|---|---|---|"]
    for o in sorted(outcomes, key=lambda o: o.test):
        verdict = ("0", "0") if o.passed else ("**FAILED**", "**FAILED**")
        lines.append(f"| {o.what.replace('|', '/')} | yes | {verdict[0]} | {verdict[1]} | {o.seconds:.0f} s | `{o.test}` |")
    return "\n".join(lines)


def write(docs: Path, section: str) -> None:
    """Replace the generated race rows of ``docs`` (appended under "## Races" if not there yet)."""
    text = docs.read_text()
    if BEGIN not in text:
        head, sep, tail = text.partition("\n## Races\n")
        if not sep:
            text += f"\n## Races\n\n{BEGIN}\n{END}\n"
        else:
            nxt = tail.find("\n## ")
            body, rest = (tail, "") if nxt < 0 else (tail[:nxt], tail[nxt:])
            text = head + sep + body.rstrip("\n") + f"\n\n{BEGIN}\n{END}\n" + rest
    head, rest = text.split(BEGIN, 1)
    docs.write_text(head + BEGIN + "\n" + section + "\n" + END + rest.split(END, 1)[1])
