"""``zproto`` command line: generate, check, selftest.

Prints a line per file written or found stale (``-v``: also the ones already up to
date; ``-q``: only problems).  Exit codes (``zerohub.cli.ExitCode``, the same in
every zerohub command): 0 ok; 1 ``check`` found stale files, ``selftest`` a failed
message, or an output could not be written; 2 usage or a bad model (missing file,
malformed XML, invalid model); 130 interrupted (Ctrl-C); 141 stdout closed by its
reader (``zproto check | head``).  Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from zerohub.cli import ArgumentParser, CommandError, UsageError, run, verbosity_flags
from zproto import __version__, selftest
from zproto.errors import ModelError
from zproto.generate import find_models, find_root, render


def _say(args: argparse.Namespace, line: str, *, detail: bool = False) -> None:
    """A progress line: ``detail`` lines need ``-v``; none with ``-q``."""
    if not args.quiet and (args.verbose or not detail):
        print(line)


def _generate(args: argparse.Namespace) -> int:
    for model in args.models:
        out_dir = Path(args.output) if args.output else None
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
        _proto, outputs = render(Path(model), out_dir)
        for path, text in outputs.items():
            old = path.read_text(encoding="utf-8") if path.exists() else None
            if old != text:
                path.write_text(text, encoding="utf-8")
                _say(args, f"zproto: wrote {path}")
            else:
                _say(args, f"zproto: {path} is up to date", detail=True)
    return 0


def _check(args: argparse.Namespace) -> int:
    root = Path(args.root) if args.root else find_root(Path.cwd())
    models = [Path(m) for m in args.models] if args.models else find_models(root)
    if not models:
        raise CommandError(f"check: no models found under {root}")
    stale = 0
    for model in models:
        _proto, outputs = render(model)
        for path, text in outputs.items():
            old = path.read_text(encoding="utf-8") if path.exists() else ""
            if old == text:
                _say(args, f"ok      {path}", detail=True)
                continue
            stale += 1
            print(f"STALE   {path} (regenerate with: zproto generate {model})")
            diff = difflib.unified_diff(
                old.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"{path} (committed)",
                tofile=f"{path} (generated)",
                n=2,
            )
            sys.stdout.writelines(list(diff)[:200])
    print(f"zproto check: {len(models)} model(s), {stale} stale file(s)")
    return 1 if stale else 0


def _selftest(args: argparse.Namespace) -> int:
    failed = 0
    for model in args.models:
        proto, outputs = render(Path(model))
        code = next(text for path, text in outputs.items() if path.suffix == ".py")
        module = selftest.load_module(code, f"_zproto_selftest_{proto.name}")
        for result in selftest.run(proto, module):
            status = ""
            if not result.roundtrip_ok:
                status = "  ROUND-TRIP FAILED"
            elif result.expected is not None and result.expected.upper() != result.digest:
                status = f"  DIGEST MISMATCH (model says {result.expected})"
            print(f"{result.name} {result.digest}{status}")
            failed += not result.ok
    return 1 if failed else 0


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="zproto",
        description="Generate Python codecs from zproto XML protocol models.",
        parents=[verbosity_flags(top=True)],
    )
    parser.add_argument("--version", action="version", version=f"zproto {__version__}")
    flags = verbosity_flags(top=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gen = sub.add_parser(
        "generate", help="write MODEL.py and MODEL.md beside each model", parents=[flags]
    )
    gen.add_argument("models", nargs="+", metavar="MODEL.xml", help="protocol models")
    gen.add_argument("-o", "--output", metavar="DIR", help="write into DIR instead")
    gen.set_defaults(func=_generate)
    chk = sub.add_parser(
        "check", help="regenerate every model; fail on any difference", parents=[flags]
    )
    chk.add_argument("models", nargs="*", metavar="MODEL.xml", help="default: all in the project")
    chk.add_argument("--root", help="project root (default: nearest pyproject.toml)")
    chk.set_defaults(func=_check)
    st = sub.add_parser(
        "selftest", help="encode/decode every message from its <test> values", parents=[flags]
    )
    st.add_argument("models", nargs="+", metavar="MODEL.xml", help="protocol models")
    st.set_defaults(func=_selftest)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: this program's arguments); the exit code."""
    return run("zproto", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ModelError as exc:  # a missing or unreadable model, malformed XML, ...
        raise UsageError(str(exc)) from None
    except OSError as exc:  # an output that cannot be written
        if isinstance(exc, BrokenPipeError):
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        raise CommandError(f"{where}{exc.strerror or exc}") from None


if __name__ == "__main__":
    sys.exit(main())
