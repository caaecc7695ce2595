"""The committed docs/openapi.json is the app's schema, and the served /openapi.json is the same document."""

from __future__ import annotations

import httpx

from scheduler.api import schema


def test_the_committed_schema_matches_the_code(capsys):
    assert schema.main(["--check"]) == 0, capsys.readouterr().err


def test_check_fails_naming_the_file_when_they_differ(tmp_path, capsys):
    stale = tmp_path / "openapi.json"
    stale.write_text(schema.render(schema.document()).replace('"title": "trigger engine API"', '"title": "old"'))
    assert schema.main(["--check", "--path", str(stale)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {stale} differs from the code's schema; run python -m scheduler.api.schema --write")
    assert schema.main(["--write", "--path", str(stale)]) == 0
    assert schema.main(["--check", "--path", str(stale)]) == 0


def test_the_served_schema_is_the_committed_one(api):
    served = httpx.get(f"{api.url}/openapi.json")
    assert served.status_code == 200
    assert served.json() == schema.document()
