"""``zerohub.config``: one TOML schema for the hub, errors naming the key and its line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from broker.engine.limits import Limits
from tests.ports import free_port
from zerohub import config
from zerohub.config import ConfigError, key_line, parse

from .support import cli, one_line

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hub.toml"


def published(tmp_path: Path, extra: str = "", *, before: str = "") -> str:
    (tmp_path / "public").mkdir(exist_ok=True)
    return f'{before}[[files.publish]]\ndir = "{tmp_path / "public"}"\n{extra}'


def error_of(text: str, tmp_path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse(text, path="hub.toml", base=tmp_path)
    return caught.value


def test_the_example_file_loads_with_its_documented_defaults(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "hub.toml")
    (tmp_path / "public").mkdir()
    loaded = config.load(tmp_path / "hub.toml")
    defaults = config.HubConfig()
    # every value the example shows is the default, but for its publish and exclude lines
    assert loaded.files.publish == (config.PublishConfig(tmp_path / "public", "/"),)
    assert loaded.files.exclude == ("*.tmp", "!keep.tmp")
    for name in ("bind", "chunk_size", "client_ttl", "wire", "watch", "settle", "links"):
        assert getattr(loaded.files, name) == getattr(defaults.files, name), name
    assert loaded.broker == defaults.broker
    assert loaded.limits == Limits()
    assert loaded.metrics == defaults.metrics
    assert loaded.console == defaults.console
    assert loaded.logging == defaults.logging


def test_values_of_every_type_are_read(tmp_path: Path) -> None:
    text = published(
        tmp_path,
        'at = "/docs"\n[files]\nchunk_size = 4096\nclient_ttl = 2\ninsecure = true\n'
        'deny = ["/docs/private"]\n[limits]\nmax_clients = 7\n'
        '[metrics]\nenabled = true\naddress = "127.0.0.1:0"\n'
        '[logging]\nlevel = "debug"\nformat = "json"\nfile = "hub.log"\n',
    )
    loaded = parse(text, base=tmp_path)
    assert loaded.files.publish[0].at == "/docs"
    assert loaded.files.chunk_size == 4096
    assert loaded.files.client_ttl == 2.0 and isinstance(loaded.files.client_ttl, float)
    assert loaded.files.insecure is True
    assert loaded.files.deny == ("/docs/private",)
    assert loaded.limits.max_clients == 7
    assert loaded.limits.max_channels == Limits().max_channels
    assert loaded.metrics.enabled and loaded.metrics.address == "127.0.0.1:0"
    assert loaded.logging.file == tmp_path / "hub.log"  # relative to the file's folder


def test_malformed_toml_names_the_line(tmp_path: Path) -> None:
    err = error_of('[files]\nbind = "tcp://127.0.0.1:5670"\nchunk_size = = 3\n', tmp_path)
    assert str(err).startswith("hub.toml:3: not valid TOML")
    assert err.line == 3


@pytest.mark.parametrize(
    ("extra", "key", "line", "says"),
    [
        ("[files]\nbnid = 'x'\n", "files.bnid", 5, "unknown key"),
        ("[metrics]\n\nenabeld = true\n", "metrics.enabeld", 6, "unknown key"),
        ("[broker]\nping_interval = 'fast'\n", "broker.ping_interval", 5, "expected a number"),
        ("[files]\nchunk_size = 1.5\n", "files.chunk_size", 5, "whole number"),
        ("[files]\nwatch = 1\n", "files.watch", 5, "expected true or false"),
        ("[files]\nclient_ttl = nan\n", "files.client_ttl", 5, "finite number"),
        ("[console]\nrefresh = inf\n", "console.refresh", 5, "finite number"),
        ("[files]\nchunk_size = 0\n", "files.chunk_size", 5, "at least 1"),
        ("[files]\nwire = 'zmtp'\n", "files.wire", 5, "one of spec, czmq"),
        ("[logging]\nlevel = 'loud'\n", "logging.level", 5, "one of debug"),
        ("[limits]\nmax_clients = 0\n", "limits.max_clients", 5, "positive integer"),
        ("[limits]\nmax_clientz = 5\n", "limits.max_clientz", 5, "unknown key"),
        ("[limits]\nmax_reply_size = 100\n", "limits.max_reply_size", 5, "at least 4096"),
        ("[metrics]\naddress = '0.0.0.0:9464'\n", "metrics.address", 5, "not a loopback"),
        ("[console]\naddress = 'nonsense'\n", "console.address", 5, "HOST:PORT"),
        ("[broker]\nbind = 'tcp:/x'\n", "broker.bind", 5, "bad endpoint"),
        ("[files]\ncurve_secret = 'k'\n", "files.curve_secret", 5, "files.allow"),
        ("[broker]\nbind = 'tcp://0.0.0.0:5680'\n", "broker.bind", 5, "insecure = true"),
        ("[files]\ndeny = ['/../etc']\n", "files.deny[0]", 5, "'..'"),
        ("[files]\nexclude = ['a', 7]\n", "files.exclude[1]", 5, "expected a string"),
        ("[loging]\nlevel = 'info'\n", "loging", 4, "unknown table"),
    ],
)
def test_a_wrong_value_names_its_key_and_line(
    tmp_path: Path, extra: str, key: str, line: int, says: str
) -> None:
    err = error_of(published(tmp_path, "\n" + extra), tmp_path)
    assert err.key == key
    assert says in str(err)
    assert err.line == line, str(err)
    assert str(err).startswith(f"hub.toml:{line}: " if line else "hub.toml: ")


def test_a_top_level_value_where_a_table_belongs(tmp_path: Path) -> None:
    err = error_of(published(tmp_path, before="metrics = 3\n"), tmp_path)
    assert (err.key, err.line) == ("metrics", 1)
    assert "expected a table, not a number" in str(err)


def test_a_published_directory_that_does_not_exist(tmp_path: Path) -> None:
    text = published(tmp_path, '[[files.publish]]\ndir = "missing"\nat = "/m"\n')
    err = error_of(text, tmp_path)
    assert err.key == "files.publish[1].dir"
    assert err.line == 4
    assert f"{tmp_path / 'missing'} does not exist" in str(err)


def test_a_published_file_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    err = error_of('[[files.publish]]\ndir = "f"\n', tmp_path)
    assert "is not a directory" in str(err)
    assert err.line == 2


def test_a_virtual_path_that_escapes_the_root_is_refused(tmp_path: Path) -> None:
    err = error_of(published(tmp_path, 'at = "/docs/../../etc"\n'), tmp_path)
    assert err.key == "files.publish[0].at"
    assert err.line == 3
    assert "'..'" in str(err)


def test_a_virtual_path_must_be_absolute(tmp_path: Path) -> None:
    err = error_of(published(tmp_path, 'at = "docs"\n'), tmp_path)
    assert err.key == "files.publish[0].at"


def test_one_virtual_path_published_twice(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    text = published(tmp_path, '[[files.publish]]\ndir = "other"\nat = "/"\n')
    err = error_of(text, tmp_path)
    assert (err.key, err.line) == ("files.publish[1].at", 5)
    assert "/ is published twice (entry 0)" in str(err)


def test_metrics_and_console_on_one_address(tmp_path: Path) -> None:
    both = "[metrics]\nenabled = true\n[console]\nenabled = true\naddress = '127.0.0.1:9464'\n"
    err = error_of(published(tmp_path, both), tmp_path)
    assert (err.key, err.line) == ("console.address", 7)
    assert "is the metrics address too" in str(err)


def test_nothing_published_is_an_error(tmp_path: Path) -> None:
    err = error_of("[files]\nbind = 'tcp://127.0.0.1:5670'\n", tmp_path)
    assert err.key == "files.publish"
    assert "publish at least one directory" in str(err)


def test_publish_entry_without_dir(tmp_path: Path) -> None:
    err = error_of('[[files.publish]]\nat = "/x"\n', tmp_path)
    assert err.key == "files.publish[0]"
    assert err.line == 1


def test_an_unreadable_pattern_file(tmp_path: Path) -> None:
    err = error_of(published(tmp_path, "[files]\nexclude_from = ['nope.txt']\n"), tmp_path)
    assert err.key == "files.exclude_from[0]"
    assert err.line == 4


def test_key_line_finds_keys_under_their_own_table() -> None:
    text = (
        "# bind = 'comment'\n"  # 1
        "[files]\n"  # 2
        "bind = 'a'\n"  # 3
        "[[files.publish]]\n"  # 4
        "dir = 'x'\n"  # 5
        "[[files.publish]]  # second\n"  # 6
        "  dir = 'y'\n"  # 7
        '[ "broker" ]\n'  # 8
        "bind = 'b'\n"  # 9
    )
    assert key_line(text, "files.bind") == 3
    assert key_line(text, "files.publish[0].dir") == 5
    assert key_line(text, "files.publish[1].dir") == 7
    assert key_line(text, "files.publish[1]") == 6
    assert key_line(text, "broker.bind") == 9
    assert key_line(text, "broker") == 8
    assert key_line(text, "metrics.address") == 0  # not in the text: no line, no guess


def test_read_errors_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        config.load(tmp_path / "absent.toml")
    (tmp_path / "latin1.toml").write_bytes(b"# caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        config.load(tmp_path / "latin1.toml")


# -- the command line -------------------------------------------------------------------


def test_serve_with_a_bad_config_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "hub.toml"
    path.write_text(published(tmp_path, "[files]\nchunk_size = 'big'\n"))
    done = cli("zerohub", "serve", "--config", str(path), timeout=30)
    assert done.returncode == 2
    assert one_line(done.stderr) == (
        f"zerohub: {path}:4: files.chunk_size: expected a number, not a string"
    )


def test_serve_with_malformed_toml_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "hub.toml"
    path.write_text("[files\n")
    done = cli("zerohub", "serve", "--config", str(path), timeout=30)
    assert done.returncode == 2
    assert one_line(done.stderr).startswith(f"zerohub: {path}:1: not valid TOML")


def test_serve_options_and_config_do_not_mix(tmp_path: Path) -> None:
    path = tmp_path / "hub.toml"
    path.write_text(published(tmp_path))
    done = cli("zerohub", "serve", "--config", str(path), "--publish", str(tmp_path), timeout=30)
    assert done.returncode == 2
    assert one_line(done.stderr) == (
        "zerohub: serve: --publish goes in the config file with --config"
    )


def test_a_non_loopback_bind_with_insecure_is_allowed(tmp_path: Path) -> None:
    loaded = parse(published(tmp_path, "[files]\nbind = 'tcp://*:5670'\ninsecure = true\n"))
    assert loaded.files.bind == "tcp://*:5670"


def test_http_doors_off_loopback_are_refused_on_the_command_line(tmp_path: Path) -> None:
    done = cli("zerohub", "serve", "--publish", str(tmp_path), "--console", "0.0.0.0:80")
    assert done.returncode == 2
    assert "argument --console: 0.0.0.0 is not a loopback address" in one_line(done.stderr)


def test_serve_needs_publish_or_config() -> None:
    done = cli("zerohub", "serve", timeout=30)
    assert done.returncode == 2
    assert one_line(done.stderr) == "zerohub: serve: --publish DIR or --config FILE is required"


def test_a_metrics_port_in_use_is_one_line_and_exit_1(tmp_path: Path) -> None:
    import socket

    (tmp_path / "public").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli(
            "zerohub",
            "serve",
            "--publish",
            str(tmp_path / "public"),
            "--bind",
            "tcp://127.0.0.1:*",
            "--broker-bind",
            f"tcp://127.0.0.1:{free_port()}",
            "--no-state",
            "--metrics",
            f"127.0.0.1:{port}",
            timeout=30,
        )
    assert done.returncode == 1
    assert one_line(done.stderr) == (
        f"zerohub: metrics: cannot listen on 127.0.0.1:{port}: address in use"
    )


def test_a_log_file_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "public").mkdir()
    done = cli(
        "zerohub",
        "serve",
        "--publish",
        str(tmp_path / "public"),
        "--log-file",
        str(tmp_path / "no" / "such" / "dir.log"),
        timeout=30,
    )
    assert done.returncode == 1
    assert one_line(done.stderr).startswith("zerohub: cannot open log file ")


def test_json_log_lines_name_the_error() -> None:
    import json
    import logging

    from zerohub.logs import JsonFormatter

    try:
        raise OSError("disk on fire")
    except OSError:
        record = logging.getLogger("filemq.server").makeRecord(
            "filemq.server", logging.ERROR, __file__, 1, "cannot save %s", ("index",), None
        )
        import sys

        record.exc_info = sys.exc_info()
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "error" and line["logger"] == "filemq.server"
    assert line["message"] == "cannot save index"
    assert line["error"] == "OSError: disk on fire"
    assert line["time"].endswith("+00:00")
