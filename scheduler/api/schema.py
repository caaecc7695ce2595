"""The committed OpenAPI document: ``python -m scheduler.api.schema --check | --write``.

``docs/openapi.json`` is the app's ``/openapi.json`` (:func:`document`),
written with sorted keys and two-space indentation so a diff reads well.
``--check`` exits 1 (naming the file and the first differing line) when
the committed file differs from the code's schema, 0 when they agree (CI
runs it: ``.ci/run``); ``--write`` regenerates the file. Needs no store.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
"""``docs/openapi.json`` of the checkout this module is in."""

_PLACEHOLDER_DSN = "postgresql://schema@localhost/schema"
"""The app is built (never started) to read its schema: no connection is opened."""


def document() -> dict[str, Any]:
    """The application's OpenAPI document (a dict, as served at ``/openapi.json``)."""
    from scheduler.api.app import create_app

    return create_app(_PLACEHOLDER_DSN).openapi()


def render(doc: dict[str, Any]) -> str:
    """``doc`` as the committed text: sorted keys, indent 2, non-ASCII kept, final newline."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0 agree/written, 1 differ or missing)."""
    parser = argparse.ArgumentParser(prog="python -m scheduler.api.schema", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail if the committed schema differs from the code's")
    mode.add_argument("--write", action="store_true", help="regenerate the committed schema")
    parser.add_argument(
        "--path", type=Path, default=DEFAULT_PATH, help="the committed file (default: docs/openapi.json)"
    )
    args = parser.parse_args(argv)
    text = render(document())
    if args.write:
        args.path.write_text(text, encoding="utf-8")
        print(f"wrote {args.path}")
        return 0
    try:
        committed = args.path.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"error: {args.path}: {exc.strerror or exc}; run python -m scheduler.api.schema --write", file=sys.stderr)
        return 1
    if committed == text:
        print(f"{args.path}: matches the code's schema")
        return 0
    diff = list(difflib.unified_diff(committed.splitlines(), text.splitlines(), "committed", "code", lineterm="", n=1))
    print(
        f"error: {args.path} differs from the code's schema; run python -m scheduler.api.schema --write\n"
        + "\n".join(diff[:40]),
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
