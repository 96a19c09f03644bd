"""A hub with the broker's durable log (``[broker] data`` / ``zerohub serve --data``): saved
messages survive a restart of the hub, and the log's figures are in Prometheus."""

from __future__ import annotations

from pathlib import Path

import zmq

from broker.client.blocking import Client
from tests.polling import wait_until
from tests.zerohub.test_watch import scrape, value
from zerohub.config import BrokerConfig, FilesConfig, HubConfig, MetricsConfig, PublishConfig
from zerohub.hub import build

PERSISTENT = {"Status": "Pull", "MessageDeliveryHandler": "persistent"}


def _config(tmp_path: Path) -> HubConfig:
    public = tmp_path / "public"
    public.mkdir(exist_ok=True)
    return HubConfig(
        files=FilesConfig(
            bind="tcp://127.0.0.1:*", publish=(PublishConfig(public, "/"),), state=False
        ),
        broker=BrokerConfig(bind="tcp://127.0.0.1:*", data=tmp_path / "data"),
        metrics=MetricsConfig(enabled=True, address="127.0.0.1:0"),
    )


def test_store_figures_in_prometheus_and_messages_across_a_restart(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    hub = build(_config(tmp_path), zctx)
    endpoints = hub.start()
    try:
        url = endpoints.http["metrics"]
        with Client(endpoints.broker, context=zctx, timeout=10).connect() as client:
            client.create_queue("orders", 1, PERSISTENT)
            for i in range(20):
                client.push("orders", 1, b"order %d" % i, ack=True)  # acked: saved
            samples = scrape(url)
            assert value(samples, "zerohub_store_live_records") == 20
            assert value(samples, "zerohub_store_segments") >= 1
            assert value(samples, "zerohub_store_disk_bytes") > 20 * len(b"order 10")
            batches = value(samples, "zerohub_store_batches_total")
            records = value(samples, "zerohub_store_batch_records_total")
            assert 1 <= batches <= records and records >= 20  # (definitions are records too)
            assert value(samples, "zerohub_store_fsyncs_total") >= 1
            assert value(samples, "zerohub_store_fsync_seconds_total") > 0
            assert value(samples, "zerohub_store_compactions_total") == 0
            assert value(samples, "zerohub_store_recovered_records") == 0

            client.join("orders")
            taken = client.pull("orders", 1, count=5)
            for message in taken:
                client.ack(message)
            assert wait_until(
                lambda: scrape(url)[("zerohub_store_live_records", ())] == 15, timeout=30
            )
    finally:
        hub.stop()

    again = build(_config(tmp_path), zctx)
    endpoints = again.start()
    try:
        samples = scrape(endpoints.http["metrics"])
        assert value(samples, "zerohub_store_recovered_records") >= 15
        assert value(samples, "zerohub_broker_queue_messages", channel="orders", queue="1") == 15
    finally:
        again.stop()


def test_data_from_the_file_and_an_unusable_data_dir_is_one_line(tmp_path: Path) -> None:
    from tests.zerohub.support import cli, one_line
    from zerohub.cli import ExitCode
    from zerohub.config import ConfigError, parse

    (tmp_path / "public").mkdir()
    text = '[broker]\ndata = "kept"\n[[files.publish]]\ndir = "public"\n'
    assert parse(text, base=tmp_path).broker.data == tmp_path / "kept"
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    answer = cli(
        "zerohub", "serve", "--publish", str(tmp_path / "public"), "--no-state",
        "--bind", "tcp://127.0.0.1:*", "--broker-bind", "tcp://127.0.0.1:*",
        "--data", str(blocker / "data"),
    )  # fmt: skip
    assert answer.returncode == ExitCode.FAILURE
    assert one_line(answer.stderr).startswith(f"zerohub: broker: --data {blocker / 'data'}: ")
    try:
        parse(text + '[console]\ntoken = "short"\n', base=tmp_path)
    except ConfigError as exc:
        assert "console.token" in str(exc) and ":6:" in str(exc)
    else:
        raise AssertionError("a short console token was taken")
