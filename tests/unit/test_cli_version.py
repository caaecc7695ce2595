"""``scheduler --version`` names the engine's version and the IANA release of its bundled tzdata
(docs/operations.md, 'Time-zone database updates')."""

from __future__ import annotations

import tzdata
from click.testing import CliRunner

from scheduler import __version__
from scheduler.cli import cli


def test_version_names_the_bundled_tzdata_release() -> None:
    result = CliRunner().invoke(cli, ["--version"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"scheduler, version {__version__} (tzdata {tzdata.IANA_VERSION})\n"
