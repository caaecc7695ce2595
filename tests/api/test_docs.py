"""docs/api.md's examples run as written against a served API (curl and jq, as a reader would)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
RUN_SECTIONS = ("Keys", "Errors", "Explain", "Admin")
"""Sections whose ``sh`` blocks run (Running starts servers; the others are for their own endpoints)."""


def _blocks(section: str, language: str) -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    body = re.split(r"^## ", text, flags=re.M)
    [part] = [p for p in body if p.startswith(section + "\n")]
    return re.findall(r"```" + language + r"\n(.*?)```", part, flags=re.S)


@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("jq") is None, reason="needs curl and jq")
def test_the_examples_run_against_the_api(api, tmp_path):
    script = "\n".join(block for section in RUN_SECTIONS for block in _blocks(section, "sh"))
    script = script.replace("http://127.0.0.1:8080", api.url)
    statuses = tmp_path / "statuses"
    # Every curl also appends its status code to a file, so the test sees what the reader would.
    write_out = "'%{stderr}%{http_code}\\n'"
    prelude = f'set -euo pipefail\ncurl() {{ command curl --write-out {write_out} "$@" 2>>{statuses}; }}\n'
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env |= {"SCHEDULER_DSN": api.dsn, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}
    result = subprocess.run(["bash", "-c", prelude + script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    codes = statuses.read_text().split()
    assert codes.count("422") == 1, codes  # the Errors example
    assert all(code.startswith("2") for code in codes if code != "422"), codes
    [explained] = _blocks("Explain", "json")
    assert json.loads(explained) in [json.loads(chunk) for chunk in _json_documents(result.stdout)]
    [error] = _blocks("Errors", "json")
    assert json.loads(error) in [json.loads(chunk) for chunk in _json_documents(result.stdout)]


def _json_documents(text: str) -> list[str]:
    """The JSON values printed one after another in ``text`` (compact or indented by jq)."""
    decoder = json.JSONDecoder()
    out, index = [], 0
    while index < len(text):
        if text[index] in "{[":
            try:
                _, end = decoder.raw_decode(text, index)
            except json.JSONDecodeError:
                index += 1
                continue
            out.append(text[index:end])
            index = end
        else:
            index += 1
    return out
