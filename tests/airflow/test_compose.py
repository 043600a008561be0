"""docker-compose.yml, kept honest without Docker: every service's command must be one the
project runs natively (parsed by the real CLI parsers, executables present in the venv), its ports
must match the ports in its command, and its volumes/paths must match the repo and the env."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _flag(command, name):
    return command[command.index(name) + 1] if name in command else None


def test_every_service_has_a_known_native_command(compose):
    from airflow.cli.cli_parser import get_parser

    from checkpoint_lib.cli import build_parser

    airflow_parser, ckpt_parser = get_parser(), build_parser()
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    for name, service in compose["services"].items():
        command = service.get("command")
        if name == "postgres":
            assert command is None and service["image"].startswith("postgres:")
            continue
        assert command, name
        program = command[0]
        if program == "airflow":
            assert (VENV_BIN / "airflow").exists()
            airflow_parser.parse_args(command[1:])
        elif program == "ckpt":
            assert (VENV_BIN / "ckpt").exists()
            ckpt_parser.parse_args(command[1:])
        elif program == "spark-class":
            assert spark_class.exists()
            assert command[1] in ("org.apache.spark.deploy.master.Master", "org.apache.spark.deploy.worker.Worker")
        else:
            pytest.fail(f"service {name}: unknown program {program!r}")


def test_airflow_has_the_four_components_on_postgres_with_auth_and_no_baked_secrets(compose):
    services = compose["services"]
    commands = {tuple(s["command"][:2]) for s in services.values() if s.get("command", [""])[0] == "airflow"}
    for sub in ("api-server", "scheduler", "dag-processor", "triggerer"):
        assert ("airflow", sub) in commands
    text = (REPO / "docker-compose.yml").read_text()
    for name, service in services.items():
        env = service.get("environment") or {}
        for key, value in env.items():
            if key.endswith("_FILE"):
                assert str(value).startswith("/run/secrets/"), f"{name}: {key} must be a compose secret"
            elif any(word in key.upper() for word in ("PASSWORD", "SECRET", "FERNET")):
                assert str(value).startswith("${") and ":?" in str(value), f"{name}: {key} must come from .env"
        if name.startswith("airflow-"):
            assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql")
            assert "SIMPLE_AUTH_MANAGER_ALL_ADMINS" not in text


def test_ports_match_the_commands(compose):
    s = compose["services"]
    api = s["airflow-api-server"]
    assert api["ports"] == [f"{_flag(api['command'], '--port')}:{_flag(api['command'], '--port')}"]
    master = s["spark-master"]
    assert set(master["ports"]) == {f"{_flag(master['command'], p)}:{_flag(master['command'], p)}"
                                    for p in ("--port", "--webui-port")}
    port = _flag(master["command"], "--port")
    for name in ("spark-worker-1", "spark-worker-2"):
        assert s[name]["command"][-1] == f"spark://spark-master:{port}"
    for name, service in s.items():
        if name.startswith("airflow-"):
            assert service["environment"]["CKPT_SPARK_MASTER"] == f"spark://spark-master:{port}"


def test_volumes_match_what_runs_natively(compose):
    for name, service in compose["services"].items():
        if not name.startswith("airflow-"):
            continue
        env, volumes = service["environment"], service["volumes"]
        mounts = {v.split(":")[1]: v.split(":")[0] for v in volumes}
        assert mounts[env["AIRFLOW__CORE__DAGS_FOLDER"]] == "./dags" and (REPO / "dags").is_dir()
        assert mounts[env["AIRFLOW__CORE__PLUGINS_FOLDER"]] == "./plugins" and (REPO / "plugins" / "ckpt_plugin.py").is_file()
        assert mounts[env["CKPT_WAREHOUSE"]] == "warehouse"
    assert "warehouse" in compose["volumes"]
    for name in ("spark-master", "spark-worker-1", "spark-worker-2", "demo"):
        assert "warehouse:/warehouse" in compose["services"][name]["volumes"]


def test_the_secrets_git_ignores_never_enter_the_image(compose):
    """The Dockerfile copies the build context: every secret file compose reads (its .env and
    its ``secrets:``) must be in .dockerignore, as it is in .gitignore."""
    assert "COPY . ." in (REPO / "Dockerfile").read_text()
    ignored = {line.strip().rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()}
    git_ignored = {line.strip().rstrip("/") for line in (REPO / ".gitignore").read_text().splitlines()}
    secret_files = {".env"} | {Path(s["file"]).name for s in compose.get("secrets", {}).values()}
    assert secret_files == {".env", "airflow_passwords.json"}
    for name in secret_files | {".airflow"}:
        assert name in ignored, f"{name} would be copied into the image"
        assert name in git_ignored, f"{name} would be committed"
