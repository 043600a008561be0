"""A warehouse on object storage from Airflow and the CLI: the hook takes the object store's
credentials from an Airflow connection (none in the environment), and the control plane it opens
works on a real S3-compatible server (tests/s3server.py); ``ckpt checkpoints list`` reads it."""

from __future__ import annotations

import json
import os

import pytest

from checkpoint_lib import cli
from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.layout import checkpoint_root, warehouse_location
from checkpoint_lib.objectstore import ObjectUri, env_from_connection

pytestmark = pytest.mark.objectstore
AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP",
            "AWS_SESSION_TOKEN")


def test_the_hook_takes_the_object_store_credentials_from_a_connection(s3_server, monkeypatch):
    from airflow.sdk.exceptions import AirflowNotFoundException

    from ckpt_airflow.hooks import CheckpointHook

    for key in AWS_VARS:  # none in the environment; and what the hook exports is undone after the test
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    warehouse = "s3://warehouse/from-a-connection"
    monkeypatch.setenv("CKPT_WAREHOUSE", warehouse)
    monkeypatch.setenv("AIRFLOW_CONN_CKPT_STORAGE", json.dumps({
        "conn_type": "aws", "login": s3_server.access_key, "password": s3_server.secret_key,
        "extra": {"region_name": "us-east-1", "endpoint_url": s3_server.endpoint}}))
    hook = CheckpointHook("payments")
    assert hook.warehouse == warehouse  # an object-store URI is kept as it is, not made a local path
    assert os.environ["AWS_ACCESS_KEY_ID"] == s3_server.access_key and os.environ["AWS_ALLOW_HTTP"] == "true"
    store = hook.control().store  # delta-rs and the conditional puts, with the connection's keys
    assert store.epochs.begin("airflow") == 1 and store.ids.get_and_increment() == 1
    assert str(hook.control().root) == f"{warehouse}/_checkpoints/payments"

    monkeypatch.setenv("AIRFLOW_CONN_CHECKPOINT_LIB_DEFAULT", json.dumps({
        "conn_type": "checkpoint_lib", "extra": {"warehouse": warehouse, "storage_conn_id": "named_but_missing"}}))
    named = CheckpointHook("payments")
    for _ in range(2):  # a connection named explicitly must exist, every time the hook is asked
        with pytest.raises(AirflowNotFoundException):
            _ = named.warehouse


def test_connections_of_each_cloud_become_the_standard_variables():
    assert env_from_connection("aws", "AK", "SK", {"region_name": "eu-west-1"}) == {
        "AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_REGION": "eu-west-1"}
    assert env_from_connection("aws", None, None, {"endpoint_url": "http://minio:9000"}) == {
        "AWS_ENDPOINT_URL": "http://minio:9000", "AWS_ALLOW_HTTP": "true"}
    assert env_from_connection("google_cloud_platform", None, None, {"extra__google_cloud_platform__key_path": "/k.json"}) \
        == {"GOOGLE_SERVICE_ACCOUNT": "/k.json"}
    assert env_from_connection("wasb", "acct", "key", {}) == {
        "AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "key"}
    with pytest.raises(ValueError, match="does not configure an object store"):
        env_from_connection("http", "u", "p", {})


def test_checkpoint_history_on_object_storage_reads_through_the_cli(s3, capsys):
    import history

    root = checkpoint_root(s3, "payments")
    assert isinstance(root, ObjectUri) and str(root) == f"{s3}/_checkpoints/payments"
    store = DeltaCheckpointStore.open(root, retained=5)
    epoch = store.epochs.begin("test")
    for cid in (1, 2):
        store.checkpoints.record_pending(store.ids.get_and_increment(), epoch=epoch, trigger_time=1000.0 + cid)
        store.checkpoints.add(history.completed(cid, 1000.0 + cid), epoch=epoch)
    assert cli.main(["checkpoints", "list", "payments", "--warehouse", s3 + "/", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["checkpoint_id"], r["status"]) for r in listed] == [(2, "completed"), (1, "completed")]


def test_a_warehouse_location_is_normalised_once():
    assert warehouse_location("s3://b/w/") == "s3://b/w"
    assert warehouse_location("~/w") == os.path.expanduser("~/w") and warehouse_location("w") == os.path.abspath("w")
    assert ObjectUri("s3://b/w") / "_checkpoints" / "p" == "s3://b/w/_checkpoints/p"
    assert ObjectUri("s3://b/w/x").parent == "s3://b/w" and ObjectUri("s3://b/w/x").name == "x"
