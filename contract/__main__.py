"""``python -m contract docs [--check]``: (re)generate docs/events.md from the schema."""

from __future__ import annotations

import argparse
import sys

from contract import DOCS_PATH
from contract.docs import render
from infra.cli import command_name, run_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command_name("contract"))
    sub = parser.add_subparsers(dest="command", required=True)
    docs = sub.add_parser("docs", help="write docs/events.md from the schema")
    docs.add_argument("--check", action="store_true", help="exit 1 if docs/events.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = DOCS_PATH.read_text(encoding="utf-8") if DOCS_PATH.exists() else ""
        if current != text:
            print(f"{DOCS_PATH} is stale: run `python -m contract docs`", file=sys.stderr)
            return 1
        return 0
    DOCS_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {DOCS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "contract"))
