"""docs/api.md, "Schedules": its curl examples run, in order, against the real API (bash, curl, jq)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def section_blocks(title: str) -> list[str]:
    """The ```sh blocks of the level-2 section ``title`` of docs/api.md, in order."""
    text = DOC.read_text("utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    return re.findall(r"```sh\n(.*?)```", body, flags=re.S)


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
def test_the_schedules_examples_work(api, tmp_path):
    blocks = [block.replace("http://127.0.0.1:8080", api.url) for block in section_blocks("Schedules")]
    assert len(blocks) >= 10
    script = "set -euo pipefail\n" + "".join(f"echo '--- {i}'\n{block}" for i, block in enumerate(blocks))
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "TENANT": api.key("acme", "tenant")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    outputs = re.split(r"^--- \d+\n", done.stdout, flags=re.M)[1:]
    assert len(outputs) == len(blocks)
    by_block = dict(zip(section_blocks("Schedules"), outputs, strict=True))

    def output(fragment: str) -> str:
        return next(out for block, out in by_block.items() if fragment in block)

    assert '"outcome": "created"' in output('"report": "daily"')
    assert output("If-Match: $ETAG").split() == ["replaced", "412"]
    assert output("DELETE").split() == ["201", "204"]
    assert output(":pause").split()[:2] == ["true", "[]"]
    assert '"created": true' in output(":trigger")
    assert '"slots": ' in output(":backfill")  # 0 or 1 slot of 02:30 Berlin in the last 3 hours
    assert output(":apply").strip() == (
        '{"created":["heartbeat","launch"],"changed":["nightly-report"],"unchanged":[],"deleted":[],"dry_run":true}'
    )
    assert output('"interval_s": 0').strip() == (
        '{"type":"about:blank","title":"Unprocessable Content","status":422,'
        '"detail":"interval_s: must be positive (at least 1 second) (got 0)","field":"interval_s"}'
    )
