"""The command line's surface, without Spark: version, exit codes, errors as one line (the
traceback with --debug), -o json, --spark-conf, hidden test knobs, the quiet Spark log."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_lib import cli
from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.spark import session


def test_version_and_the_exit_codes_in_every_help(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("ckpt (checkpoint_lib) ")
    for argv in (["--help"], ["run", "--help"], ["checkpoints", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        out = capsys.readouterr().out
        assert "exit codes:" in out and "4  a data-quality suite" in out, argv


def test_test_knobs_are_accepted_but_not_shown():
    parser = cli.build_parser()
    run = parser.parse_args(["run", "payments", "--lagging-sources", "1"])
    assert run.lagging_sources == 1
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    assert "--lagging-sources" not in sub.format_help() and "--no-chaining" in sub.format_help()


def test_spark_options_and_output_parse_where_they_belong(capsys):
    parser = cli.build_parser()
    args = parser.parse_args(["run", "payments", "--master", "local[1]", "--spark-conf", "spark.driver.memory=4g",
                              "--spark-conf", "spark.a=b=c", "-o", "json", "--debug"])
    assert (args.master, args.spark_conf, args.output, args.debug) == \
        ("local[1]", [("spark.driver.memory", "4g"), ("spark.a", "b=c")], "json", True)
    assert parser.parse_args(["checkpoints", "list", "p", "--json"]).output == "json"  # the older spelling
    with pytest.raises(SystemExit) as bad:
        parser.parse_args(["run", "payments", "--spark-conf", "no-equals-sign"])
    assert bad.value.code == cli.EXIT_USAGE and "is not KEY=VALUE" in capsys.readouterr().err


def test_an_unexpected_error_is_one_line_and_the_traceback_comes_with_debug(tmp_path, monkeypatch, capsys):
    def broken(*_a, **_kw):
        raise RuntimeError("the disk said no\nand a second line")

    monkeypatch.setattr(DeltaCheckpointStore, "existing", broken)
    argv = ["checkpoints", "list", "payments", "--warehouse", str(tmp_path)]
    assert cli.main(argv) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert err == ("ckpt: error: RuntimeError: the disk said no\n  and a second line\n"
                   "  (run again with --debug for the traceback)\n")
    with pytest.raises(RuntimeError, match="the disk said no"):
        cli.main(argv + ["--debug"])


def test_an_error_of_many_lines_is_shown_whole_without_jvm_frames(monkeypatch, tmp_path, capsys):
    problems = "checkpoint 3 does not fit the pipeline:\n  - removed operators ['x']\n  - key groups end at 63"
    frames = "\n".join(f"\tat org.apache.spark.Thing.method{i}(Thing.scala:{i})" for i in range(40))

    def refused(*_a, **_kw):
        raise ValueError(problems + "\n" + frames)

    monkeypatch.setattr(DeltaCheckpointStore, "existing", refused)
    assert cli.main(["checkpoints", "list", "payments", "--warehouse", str(tmp_path)]) == cli.EXIT_USER_ERROR
    assert capsys.readouterr().err == ("ckpt: error: checkpoint 3 does not fit the pipeline:\n  - removed operators "
                                       "['x']\n  - key groups end at 63\n")
    long = "\n".join(f"line {i}" for i in range(cli.MAX_ERROR_LINES + 5))
    monkeypatch.setattr(DeltaCheckpointStore, "existing", lambda *_a, **_kw: (_ for _ in ()).throw(ValueError(long)))
    assert cli.main(["checkpoints", "list", "payments", "--warehouse", str(tmp_path)]) == cli.EXIT_USER_ERROR
    err = capsys.readouterr().err.splitlines()
    assert len(err) == cli.MAX_ERROR_LINES + 1 and err[-1] == "  ... 5 more lines (--debug shows them)"


def test_a_closed_pipe_ends_quietly_with_success(tmp_path):
    """``ckpt ... -o json | head``: the reader leaves before the JSON is written."""
    checkout = Path(cli.__file__).parents[2]  # the folder holding checkpoint_lib/ (cli/__init__.py)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "checkpoint_lib.cli", "pipelines", "-o", "json"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first write
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == ""


def test_spark_keeps_its_catalog_warehouse_out_of_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = Path(session.session_conf("local[1]")["spark.sql.warehouse.dir"])
    assert folder.is_absolute() and tmp_path not in folder.parents and folder != tmp_path


def test_the_driver_logs_quietly_unless_asked(monkeypatch):
    monkeypatch.delenv(session.LOG_ENV, raising=False)
    quiet = session.session_conf("local[1]", extra_conf={"spark.driver.extraJavaOptions": "-Dmine=1"})
    assert quiet["spark.driver.extraJavaOptions"] == \
        f"-Dlog4j2.configurationFile={session.QUIET_LOG_CONFIG.as_uri()} -Dmine=1"
    assert session.QUIET_LOG_CONFIG.is_file()
    assert "org.apache.spark.util.Utils" in session.QUIET_LOG_CONFIG.read_text()
    monkeypatch.setenv(session.LOG_ENV, "spark")  # what --debug sets
    assert "spark.driver.extraJavaOptions" not in session.session_conf("local[1]")


def test_shell_completion_offers_sub_commands_and_options():
    ckpt = Path(sys.executable).with_name("ckpt")

    def complete(line: str) -> set[str]:
        env = {**os.environ, "_ARGCOMPLETE": "1", "_ARGCOMPLETE_IFS": " ", "COMP_LINE": line,
               "COMP_POINT": str(len(line))}
        proc = subprocess.run(f"{ckpt} 8>&1 9>/dev/null", shell=True, env=env, capture_output=True, text=True,
                              timeout=60)
        return set(proc.stdout.split())

    assert complete("ckpt re") == {"recover", "report"}
    assert complete("ckpt run payments --mo") == {"--mode"}


def test_the_rows_bar_shows_done_total_rate_and_grows_with_new_data():
    import io

    from rich.console import Console

    out = io.StringIO()
    with cli.RowsBar(1000, console=Console(file=out, force_terminal=True, width=120, color_system=None)) as bar:
        bar.update(250, 2.0, backlog=750)
        bar.update(600, 4.0, backlog=900)  # more landed meanwhile: the total is 1,500 now
        task = bar.progress.tasks[0]
        assert (task.completed, task.total, task.fields["rate"]) == (600, 1500, "150 rows/s")
    text = out.getvalue()
    assert "600/1500 rows" in text and "150 rows/s" in text


def test_the_validation_bar_counts_each_view_computed_then_validated():
    import io

    from rich.console import Console

    out = io.StringIO()
    with cli.StepsBar("validating restore", 4, console=Console(file=out, force_terminal=True, width=120,
                                                                color_system=None)) as bar:
        bar.step("computed", "events")
        bar.step("computed", "keys")
        bar.step("validated", "events")
        task = bar.progress.tasks[0]
        assert (task.completed, task.total, task.fields["step"]) == (3, 4, "events validated")
    text = out.getvalue()
    assert "validating restore" in text and "4/4" in text  # done when the suite is (a view may be absent)


def test_no_bar_for_machines_or_pipes(monkeypatch):
    parser = cli.build_parser()
    assert not cli.bar_wanted(parser.parse_args(["run", "payments", "-o", "json"]))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert not cli.bar_wanted(parser.parse_args(["run", "payments"]))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert cli.bar_wanted(parser.parse_args(["run", "payments"]))


def test_validate_starts_one_session_for_both_suites(tmp_path, monkeypatch, capsys):
    """`ckpt validate --suite all` asks for its Spark session once: a second request with options
    that only apply at start (``--spark-conf spark.driver.extraJavaOptions=...``) was refused by
    the session the first one started ("cannot change on the running Spark session"). The driver
    is short-lived (C1 only) when the pipeline's tables are driver-sized."""
    from types import SimpleNamespace

    from checkpoint_lib import quality
    from checkpoint_lib.cli import context

    sessions, suites = [], []
    monkeypatch.setattr(context, "spark_session", lambda args, short_lived=False: sessions.append(short_lived) or object())

    def suite(kind):
        def run(spark, pipeline, warehouse, checkpoint, progress=None, session=None):
            suites.append((kind, spark))
            return SimpleNamespace(success=True, checkpoint_id=1, outcomes=[], failed=[], data_docs="",
                                   headline=lambda: kind, summary=lambda verbose=False: kind)
        return run

    monkeypatch.setattr(quality, "validate_restore", suite("restore"))
    monkeypatch.setattr(quality, "validate_checkpoint", suite("checkpoint"))
    (tmp_path / "w").mkdir()
    code = cli.main(["validate", "payments", "--warehouse", str(tmp_path / "w"),
                     "--spark-conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1"])
    assert code == 0, capsys.readouterr().err
    assert len(sessions) == 1 and [k for k, _ in suites] == ["restore", "checkpoint"]
    assert suites[0][1] is suites[1][1]
    assert sessions == [True]  # no table over DRIVER_ROWS: a short-lived driver (C1 only)
    from checkpoint_lib.quality import context as quality_context

    monkeypatch.setattr(quality_context, "DRIVER_ROWS", -1)
    assert cli.main(["validate", "payments", "--warehouse", str(tmp_path / "w")]) == 0
    assert sessions == [True, False]


def test_a_rescale_says_where_the_parallelism_comes_from_and_how_to_keep_the_earlier_one():
    """The stopped stage's parallelism comes back from JSON in any key order: the message names
    the sources first either way (the slow rescale test sees it through a real run)."""
    from checkpoint_lib.spark.runner import rescale_message

    said = rescale_message("source", {"operator": 5, "source": 3}, {"source": 2, "operator": 2}, "--parallelism 2")
    assert said == ("parallelism changed: the source stage stopped at source 3, operator 5, now source 2, operator 2 "
                    "(from --parallelism 2); recovering to rescale the latest checkpoint (to keep the earlier "
                    "parallelism, run with --source-parallelism 3 --parallelism 5)")
    declared = rescale_message("keyed", {"source": 2, "operator": 4}, {"source": 2, "operator": 2}, None)
    assert "(as the pipeline declares it)" in declared and declared.endswith("run with --parallelism 4)")


def test_the_stage_names_are_one_vocabulary():
    """A pipeline's stages are named alike by the runner, the submitter of its processes, the CLI's
    ``--stage`` and the job-graph planner's stage layout (each spells them: this keeps them one)."""
    from checkpoint_lib import submit
    from checkpoint_lib.graph.jobgraph import KEYED_STAGE, SOURCE_STAGE
    from checkpoint_lib.spark.runner import STAGES

    assert STAGES == (SOURCE_STAGE, KEYED_STAGE)
    assert set(submit.STAGES) == {*STAGES, "all"}
    run = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    stage = next(a for a in run._actions if a.dest == "stage")
    assert stage.default == "all" and all(name in stage.help for name in ("all", *STAGES))
