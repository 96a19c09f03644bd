"""``filemq manifest``: make, import and compare manifests (``filemq.manifest``).

* ``filemq manifest [--spark [--master URL]] ROOT OUT``: list and hash every file under
  ROOT and write the Parquet manifest OUT (a new path).  Without ``--spark`` in this
  process; with it on Spark (``--master``, default ``local[*]``; ``filemq.manifest_spark``).
  Prints ``N files, B octets, U unreadable`` on stderr; exit 1 when a file could not be
  read (the manifest is written without it).
* ``filemq manifest import MANIFEST ROOT [--at /virtual] [--state-dir DIR | --index FILE
  | --mirror]``: write the index the FILEMQ server publishing ROOT at ``--at`` (default
  ``/``) loads from ``--state-dir`` at start-up (default the server's), or the index of
  a mirror's DEST (``--mirror``: where ``filemq sync``/``subscribe`` keep it by default),
  or the index at ``--index FILE`` (a mirror's ``--index``).  The server then hashes only
  the files that changed since the manifest was made.
* ``filemq manifest diff [--spark [--master URL]] A B``: one ``CHANGE PATH`` line on
  stdout per path that differs from manifest A to B (added, removed, changed: content;
  touched: mtime only), sorted by path.

Exit codes as every filemq command (``zerohub.cli.ExitCode``): 1 a failure (a manifest
that cannot be read, OUT that exists, Spark or Java missing), 2 usage.  ROOT named
``diff`` or ``import``: write ``./diff``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from zerohub.cli import CommandError, UsageError

log = logging.getLogger("filemq")

_ACTIONS = {"diff": 2, "import": 2}  # action word -> operands after it


def manifest_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "operands",
        nargs="+",
        metavar="ROOT OUT | import MANIFEST ROOT | diff A B",
        help="what to do (see the description)",
    )
    command.add_argument("--spark", action="store_true", help="run the job on Spark")
    command.add_argument(
        "--master", metavar="URL", help="Spark master (with --spark; default local[*])"
    )
    command.add_argument(
        "--at", default="/", metavar="/virtual", help="import: the mount's virtual path"
    )
    where = command.add_mutually_exclusive_group()
    where.add_argument("--state-dir", metavar="DIR", help="import: the server's --state-dir")
    where.add_argument("--index", metavar="FILE", help="import: write the index at FILE")
    where.add_argument(
        "--mirror", action="store_true", help="import: ROOT is a mirror's DEST (its index)"
    )


def run_manifest(args: argparse.Namespace) -> int:
    operands: list[str] = args.operands
    action = operands[0] if operands[0] in _ACTIONS else None
    wanted = _ACTIONS[action] + 1 if action else 2
    if len(operands) != wanted:
        shape = (
            f"{action} {'A B' if action == 'diff' else 'MANIFEST ROOT'}" if action else "ROOT OUT"
        )
        raise UsageError(f"manifest: expected {shape}")
    if args.master is not None and not args.spark:
        raise UsageError("manifest: --master goes with --spark")
    if action == "import":
        if args.spark:
            raise UsageError("manifest import: --spark does not apply")
        return _import(args, operands[1], operands[2])
    if action == "diff":
        return _diff(args, operands[1], operands[2])
    return _make(args, operands[0], operands[1])


def _spark(args: argparse.Namespace) -> Any:
    from zerohub import sparkkit

    try:
        return sparkkit.session(args.master or sparkkit.DEFAULT_MASTER, "filemq-manifest")
    except sparkkit.SparkUnavailable as exc:
        raise CommandError(f"manifest --spark: {exc}") from None


def _spark_failure(exc: Exception) -> CommandError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return CommandError(f"manifest: the Spark job failed: {first[:300]}")


def _make(args: argparse.Namespace, root: str, out: str) -> int:
    from filemq import manifest

    if args.spark:
        from filemq.manifest_spark import build_on_spark

        spark = _spark(args)
        try:
            stats = build_on_spark(spark, root, out)
        except manifest.ManifestError:
            raise
        except Exception as exc:
            raise _spark_failure(exc) from None
        finally:
            spark.stop()
    else:
        table, stats = manifest.build(root)
        manifest.write(table, out)
    print(
        f"filemq: manifest {out}: {stats.files} files, {stats.octets} octets, "
        f"{stats.unreadable} unreadable",
        file=sys.stderr,
    )
    if stats.unreadable:
        raise CommandError(f"{stats.unreadable} files could not be read (left out of {out})")
    return 0


def _import(args: argparse.Namespace, source: str, root: str) -> int:
    from filemq import manifest
    from filemq.paths import virtual_path
    from filemq.state import default_state_dir, server_index_path

    if args.index:
        target = args.index
    elif args.mirror:
        from filemq.client import default_index_path

        target = str(default_index_path(root))
    else:
        state_dir = args.state_dir or default_state_dir()
        target = str(server_index_path(state_dir, root, virtual_path(args.at)))
    result = manifest.import_index(source, root, target)
    print(
        f"filemq: index {target}: {result.imported} files imported, {result.stale} changed "
        f"since the manifest (hashed at start-up), {result.refused} refused",
        file=sys.stderr,
    )
    return 0


def _diff(args: argparse.Namespace, a: str, b: str) -> int:
    from filemq import manifest

    if args.spark:
        from filemq.manifest_spark import diff_on_spark

        for path in (a, b):
            manifest.read(path)  # one line for a missing or foreign manifest, not a job
        spark = _spark(args)
        try:
            for row in diff_on_spark(spark, a, b).toLocalIterator():
                print(f"{row['change']} {row['path']}")
        except manifest.ManifestError:
            raise
        except Exception as exc:
            raise _spark_failure(exc) from None
        finally:
            spark.stop()
        return 0
    for change, path in manifest.diff(a, b):
        print(f"{change.value} {path}")
    return 0
