"""``zproto`` command line: generate, check, selftest."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from zproto import __version__, selftest
from zproto.errors import ModelError
from zproto.generate import find_models, find_root, render


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
                print(f"zproto: wrote {path}")
            else:
                print(f"zproto: {path} is up to date")
    return 0


def _check(args: argparse.Namespace) -> int:
    root = Path(args.root) if args.root else find_root(Path.cwd())
    models = [Path(m) for m in args.models] if args.models else find_models(root)
    if not models:
        print(f"zproto check: no models found under {root}", file=sys.stderr)
        return 1
    stale = 0
    for model in models:
        _proto, outputs = render(model)
        for path, text in outputs.items():
            old = path.read_text(encoding="utf-8") if path.exists() else ""
            if old == text:
                print(f"ok      {path}")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zproto", description="Generate Python codecs from zproto XML protocol models."
    )
    parser.add_argument("--version", action="version", version=f"zproto {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write MODEL.py and MODEL.md beside each model")
    gen.add_argument("models", nargs="+", metavar="MODEL.xml")
    gen.add_argument("-o", "--output", metavar="DIR", help="write into DIR instead")
    gen.set_defaults(func=_generate)
    chk = sub.add_parser("check", help="regenerate every model; fail on any difference")
    chk.add_argument("models", nargs="*", metavar="MODEL.xml", help="default: all in the project")
    chk.add_argument("--root", help="project root (default: nearest pyproject.toml)")
    chk.set_defaults(func=_check)
    st = sub.add_parser("selftest", help="encode/decode every message from its <test> values")
    st.add_argument("models", nargs="+", metavar="MODEL.xml")
    st.set_defaults(func=_selftest)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ModelError as exc:
        print(f"zproto: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
