"""The control plane on object storage, against a real S3-compatible server (SeaweedFS on 127.0.0.1,
tests/s3server.py): the store contract, ids and epochs unique under racing writers, and a store that
does not honour conditional puts refused before anything is written to it. The races of
tests/delta/test_store_races.py run on both a local folder and this server. No Spark here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.objectstore import ConditionalPutUnsupported, ObjectStoreReservations, is_remote

_CORE_TESTS = str(Path(__file__).resolve().parents[1] / "core")
if _CORE_TESTS not in sys.path:
    sys.path.insert(0, _CORE_TESTS)
from test_store_contract import (  # noqa: E402
    AckStoreContract, CompletedCheckpointStoreContract, EpochStoreContract, SessionStoreContract,
    ValidationVerdictsContract,
)

# the local suite's racers, run here on the object store
from test_store import (  # noqa: E402
    test_concurrent_begin_epoch_is_unique_and_old_reservation_markers_do_not_matter as _racing_epochs,
    test_concurrent_get_and_increment_from_threads_and_instances as _racing_ids,
    test_epochs_increase_and_fence_older_writers as _epochs_fence,
)

pytestmark = pytest.mark.objectstore


class TestDeltaStoreContractOnS3(CompletedCheckpointStoreContract):
    """The store on S3 passes exactly the contract the in-memory and the local stores pass."""

    @pytest.fixture(autouse=True)
    def _prefix(self, s3):
        self.prefix = s3
        self.made = 0

    def _fresh_root(self) -> str:
        self.made += 1
        return f"{self.prefix}/store{self.made}"

    def make_store(self, retained: int):
        return DeltaCheckpointStore(self._fresh_root(), retained).checkpoints

    def make_counter(self):
        return DeltaCheckpointStore(self._fresh_root()).ids


class TestDeltaRoleStoreContractsOnS3(EpochStoreContract, AckStoreContract, SessionStoreContract,
                                  ValidationVerdictsContract):
    """Every role store of the Delta control plane on S3 passes its role's contract."""

    @pytest.fixture(autouse=True)
    def _prefix(self, s3):
        self.prefix = s3
        self.made = 0

    def make_control(self):
        self.made += 1
        return DeltaCheckpointStore(f"{self.prefix}/control{self.made}", retained=3)


def test_ids_from_racing_threads_and_instances_are_distinct(s3):
    _racing_ids(f"{s3}/_checkpoints/p")


def test_epochs_increase_and_fence_older_writers(s3):
    _epochs_fence(f"{s3}/_checkpoints/p")


def test_racing_epoch_starters_get_distinct_epochs_and_the_newest_fences_every_table(s3):
    class Root(str):  # the racer's last lines plant an old-style marker file: a no-op here
        def __truediv__(self, other):
            return _Nowhere()

    class _Nowhere:
        def __truediv__(self, other):
            return self

        def mkdir(self, **kwargs):
            pass

        def touch(self):
            pass

    _racing_epochs(Root(f"{s3}/_checkpoints/p"))


def test_ids_are_reserved_by_conditional_puts_that_survive_a_new_instance(s3):
    root = f"{s3}/_checkpoints/p"
    first = DeltaCheckpointStore.open(root)
    assert [first.ids.get_and_increment() for _ in range(3)] == [1, 2, 3]
    again = DeltaCheckpointStore(root)
    assert again.ids.get_and_increment() == 4  # nothing in the table yet: the markers alone reserve
    markers = ObjectStoreReservations(root)
    assert all(markers.exists("ids", n) for n in (1, 2, 3, 4)) and not markers.exists("ids", 5)
    assert not markers.claim("ids", 2) and markers.claim("ids", 5)


def test_a_store_that_ignores_conditional_puts_is_refused_before_anything_is_written(s3_server, monkeypatch):
    """S3 behind something that drops If-None-Match (the server then overwrites): a second create
    of the probe succeeds, so the store is refused; no marker, no table is written."""
    import obstore
    from obstore.store import from_url
    from s3server import ANONYMOUS_BUCKET, HeaderDroppingProxy

    for key in s3_server.env():
        monkeypatch.delenv(key, raising=False)
    with HeaderDroppingProxy(s3_server.port) as proxy:
        options = {"aws_endpoint": f"http://127.0.0.1:{proxy.port}", "aws_skip_signature": "true",
                   "aws_allow_http": "true", "aws_region": "us-east-1"}
        root = f"s3://{ANONYMOUS_BUCKET}/dropping/_checkpoints/p"
        store = DeltaCheckpointStore(root, storage_options=options)
        with pytest.raises(ConditionalPutUnsupported, match="a second create of the same object succeeded"):
            store.ids.get_and_increment()
        with pytest.raises(ConditionalPutUnsupported):
            store.epochs.begin("me")  # epochs reserve their number the same way
        direct = from_url(f"s3://{ANONYMOUS_BUCKET}/dropping", aws_endpoint=s3_server.endpoint,
                          aws_skip_signature=True, aws_region="us-east-1", client_options={"allow_http": True})
        written = [m["path"] for batch in obstore.list(direct) for m in batch]
        assert not [p for p in written if "_conditional_put_probe" not in p], written


def test_a_client_with_conditional_put_switched_off_is_refused_with_a_clear_error(s3):
    store = DeltaCheckpointStore(f"{s3}/_checkpoints/p", storage_options={"aws_conditional_put": "disabled"})
    with pytest.raises(ConditionalPutUnsupported, match="does not honour create-if-absent.*client refuses it"):
        store.ids.get_and_increment()


def test_remote_locations_are_told_from_local_ones():
    assert all(is_remote(u) for u in ("s3://b/p", "s3a://b/p", "gs://b/p", "az://c/p", "abfss://c@a/p"))
    assert not any(is_remote(u) for u in ("/tmp/w", "w", "file:///tmp/w", "C:/w"))
    with pytest.raises(ValueError, match="not a local path nor an object-store URI"):
        DeltaCheckpointStore("hdfs://nn/w/_checkpoints/p")


def test_doctor_probes_a_remote_warehouse_and_refuses_one_that_ignores_conditional_puts(s3, s3_server, monkeypatch):
    from s3server import ANONYMOUS_BUCKET, HeaderDroppingProxy

    from checkpoint_lib import doctor

    check = doctor.warehouse(s3)
    assert check.ok and "honours conditional puts" in check.detail, check
    with HeaderDroppingProxy(s3_server.port) as proxy:
        for key in s3_server.env():
            monkeypatch.delenv(key, raising=False)
        for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}", "AWS_SKIP_SIGNATURE": "true",
                           "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"}.items():
            monkeypatch.setenv(key, value)
        check = doctor.warehouse(f"s3://{ANONYMOUS_BUCKET}/doctor-{s3.rsplit('-', 1)[-1]}")
    assert not check.ok and "does not honour create-if-absent" in check.detail and "If-None-Match" in check.fix
