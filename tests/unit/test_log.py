"""Structured logs and secret redaction (scheduler/log.py, store.redact_dsn / dsn_secrets / redact_text),
and the DSN check that refuses a URI libpq would misparse before any connection (store.check_dsn)."""

from __future__ import annotations

import io
import json
import logging

import psycopg
import pytest

from scheduler import log, store
from scheduler.errors import ConfigError
from scheduler.store import connect_error, dsn_secrets, redact_dsn, redact_text


@pytest.fixture
def captured():
    """The scheduler logger writing to a buffer; restored afterwards."""
    buffer = io.StringIO()

    def configure(fmt: str) -> None:
        log.configure(fmt, "debug")
        log.LOGGER.handlers[0].setStream(buffer)

    saved = (list(log.LOGGER.handlers), log.LOGGER.level, log.LOGGER.propagate)
    yield configure, buffer
    log.LOGGER.handlers[:], log.LOGGER.level, log.LOGGER.propagate = saved


def test_json_records_carry_one_event_name_and_fields(captured):
    configure, buffer = captured
    configure("json")
    log.event("lease_claimed", node="n1", partitions=3)
    log.event("tick_failed", logging.WARNING, node="n1", error="boom")
    records = [json.loads(line) for line in buffer.getvalue().splitlines()]
    assert [r["event"] for r in records] == ["lease_claimed", "tick_failed"]
    assert records[0]["partitions"] == 3 and records[0]["level"] == "info"
    assert records[1]["level"] == "warning" and records[1]["error"] == "boom"
    assert all(r["ts"].endswith("Z") for r in records)


def test_text_records_start_with_level_and_event(captured):
    configure, buffer = captured
    configure("text")
    log.event("node_started", node="n1")
    (line,) = buffer.getvalue().splitlines()
    assert line.split()[1:] == ["info", "node_started", "node=n1"]


def test_a_text_value_cannot_forge_fields_or_records(captured):
    """A request path is client input: `/v1/schedules/a%0a04:00:00.000 info api_request
    method=FAKE` was written bare (only its line break escaped), so a reader of the text
    log, or a logfmt parser, saw a second `method=`. Values with whitespace, quotes, `=` or
    backslashes are JSON strings; plain ones stay bare."""
    import shlex

    configure, buffer = captured
    configure("text")
    forged = "/v1/schedules/a\n04:00:00.000 info api_request method=FAKE"
    log.event("api_request", method="GET", path=forged, status=404, note='say "hi"', empty="")
    (line,) = buffer.getvalue().splitlines()
    fields = dict(part.split("=", 1) for part in shlex.split(line.split(" api_request ", 1)[1]))
    assert fields["method"] == "GET" and fields["status"] == "404"
    assert json.loads(line.split(" path=", 1)[1].split(" status=", 1)[0]) == forged
    assert ' note="say \\"hi\\""' in line and ' empty=""' in line
    assert log.text_value("127.0.0.1:5432") == "127.0.0.1:5432"


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_registered_secrets_never_reach_a_record(captured, fmt):
    configure, buffer = captured
    configure(fmt)
    log.add_secret("Tr0ub4dor&3-pw")
    log.event("store_unavailable", error='connection to "u:Tr0ub4dor&3-pw@h" failed', dsn="x Tr0ub4dor&3-pw")
    try:
        raise RuntimeError("failed with Tr0ub4dor&3-pw")
    except RuntimeError:
        log.event("tick_crashed", logging.ERROR, exc_info=True)
    text = buffer.getvalue()
    assert "Tr0ub4dor" not in text and "***" in text


def test_short_secrets_are_not_scrubbed_from_free_text():
    log.add_secret("ab")
    assert log.redact("abc cab") == "abc cab"


@pytest.mark.parametrize(
    "dsn, redacted, secrets",
    [
        ("postgresql://u:pa%40ss@h:5432/db", "postgresql://u:***@h:5432/db", ["pa%40ss", "pa@ss"]),
        ("postgresql://u@h/db?password=s3cret&sslmode=off", "postgresql://u@h/db?password=***&sslmode=off", ["s3cret"]),
        ("host=h user=u password=s3cret dbname=d", "host=h user=u password=*** dbname=d", ["s3cret"]),
        ("host=h password='with space' dbname=d", "host=h password=*** dbname=d", ["'with space'", "with space"]),
        ("postgresql://u@h/db", "postgresql://u@h/db", []),
        # several hosts (a high-availability pair), in the three spellings libpq accepts
        (
            "postgresql://u:s3cret-pw@h1:5432,h2:5433/db?target_session_attrs=read-write",
            "postgresql://u:***@h1:5432,h2:5433/db?target_session_attrs=read-write",
            ["s3cret-pw"],
        ),
        (
            "postgresql://u:s3cret-pw@/db?host=h1,h2&port=5432,5433&target_session_attrs=read-write",
            "postgresql://u:***@/db?host=h1,h2&port=5432,5433&target_session_attrs=read-write",
            ["s3cret-pw"],
        ),
        (
            "postgresql:///db?host=h1,h2&port=5432,5433&user=u&password=s3cret-pw&target_session_attrs=read-write",
            "postgresql:///db?host=h1,h2&port=5432,5433&user=u&password=***&target_session_attrs=read-write",
            ["s3cret-pw"],
        ),
        (
            "host=h1,h2 port=5432,5433 user=u password=s3cret-pw dbname=d target_session_attrs=read-write",
            "host=h1,h2 port=5432,5433 user=u password=*** dbname=d target_session_attrs=read-write",
            ["s3cret-pw"],
        ),
    ],
)
def test_dsn_passwords_are_found_and_masked(dsn, redacted, secrets):
    assert redact_dsn(dsn) == redacted
    assert dsn_secrets(dsn) == secrets


def test_redact_text_removes_the_dsn_and_its_password_in_any_spelling():
    dsn = "postgresql://u:pa%40ss@h:5432/db"
    text = f"at {dsn} (as postgresql+psycopg://u:pa%40ss@h:5432/db): password pa@ss rejected"
    out = redact_text(text, dsn)
    assert "pa%40ss" not in out and "pa@ss" not in out
    assert "postgresql://u:***@h:5432/db" in out


def test_a_multi_host_connection_error_names_each_host_on_one_line_without_the_password():
    """psycopg's error for a multi-host DSN: the last attempt, then one block per host tried
    (libpq's hint lines in between); store.connect_error keeps each host's reason, in order."""
    dsn = "postgresql://u:s3cret-pw@h1:5432,h2:5433,h3:5434/db?target_session_attrs=read-write"
    error = psycopg.OperationalError(
        'connection failed: connection to server at "10.0.0.3", port 5434 failed: timeout expired\n'
        "Multiple connection attempts failed. All failures were:\n"
        "- host: 'h1', port: '5432', hostaddr: '10.0.0.1': connection failed: connection to server at "
        '"10.0.0.1", port 5432 failed: Connection refused\n'
        "\tIs the server running on that host and accepting TCP/IP connections?\n"
        "- host: 'h2', port: '5433', hostaddr: '10.0.0.2': connection failed: connection to server at "
        '"10.0.0.2", port 5433 failed: session is read-only\n'
        "- host: 'h3', port: '5434', hostaddr: '10.0.0.3': connection timeout expired"
    )
    assert redact_text(connect_error(error), dsn) == (
        "h1:5432: Connection refused; h2:5433: session is read-only; h3:5434: connection timeout expired"
    )
    single = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  password '
        'authentication failed for user "u"\n\tIs the server running?'
    )
    assert connect_error(single) == '127.0.0.1:5432: FATAL:  password authentication failed for user "u"'
    assert connect_error(psycopg.OperationalError('invalid port number: "99999"\nmore')) == (
        'invalid port number: "99999"'
    )


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_multi_line_store_errors_stay_one_record_per_line(captured, fmt):
    configure, buffer = captured
    configure(fmt)
    error = 'ERROR:  relation "jobs" does not exist\nLINE 1: SELECT 1 FROM jobs\n                     ^\r\nHINT:  x'
    log.event("store_unavailable", logging.WARNING, component="lease", error=error)
    try:
        raise RuntimeError(error)
    except RuntimeError:
        log.event("tick_crashed", logging.ERROR, exc_info=True, error=error)
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 2, lines
    if fmt == "json":
        records = [json.loads(line) for line in lines]
        assert records[0]["error"] == error and "Traceback" in records[1]["exc"]
    else:
        assert lines[0].split()[1:3] == ["warning", "store_unavailable"]
        # a value with spaces is a JSON string: it reads back exactly
        assert json.loads(lines[0].split(" error=", 1)[1]) == error
        assert lines[1].split()[1:3] == ["error", "tick_crashed"] and 'exc="Traceback' in lines[1]


@pytest.mark.parametrize(
    "dsn, secret, echoed",
    [
        # libpq splits the user info at the first '@': the rest of the password becomes the host name
        (
            "postgresql://scheduler:Pass@SuperSecret42@127.0.0.1:5432/db",
            "SuperSecret42",
            "failed to resolve host 'SuperSecret42@127.0.0.1': [Errno -2] Name or service not known",
        ),
        # an unescaped '/' ends the authority for libpq: the password's tail lands in the database name
        (
            "postgresql://scheduler:pa/Tail99x@127.0.0.1/db",
            "Tail99x",
            'connection failed: FATAL:  database "Tail99x@127.0.0.1/db" does not exist',
        ),
    ],
)
def test_what_the_driver_echoes_of_a_misparsed_password_is_scrubbed(dsn, secret, echoed):
    assert secret not in redact_dsn(dsn)
    assert secret not in redact_text(echoed, dsn)
    log.add_secret(*dsn_secrets(dsn))
    assert secret not in log.redact(echoed)


@pytest.mark.parametrize(
    "dsn, text, redacted",
    [
        # what `db upgrade --dsn mysql://x:y@...` printed: the 1-character password scrubbed from "mysql"
        (
            "mysql://x:y@h:3306/db",
            'missing "=" after "mysql://x:y@h:3306/db" in connection info string',
            'missing "=" after "mysql://x:***@h:3306/db" in connection info string',
        ),
        (
            "postgresql://u:ab@h/db",
            "connection to postgresql://u:ab@h/db failed: database table absent",
            "connection to postgresql://u:***@h/db failed: database table absent",
        ),
        (
            "host=h user=u password=pw dbname=d",
            "bad option in host=h user=u password=pw dbname=d: pwd",
            "bad option in host=h user=u password=*** dbname=d: pwd",
        ),
    ],
)
def test_a_short_password_is_masked_in_the_dsn_but_never_scrubs_other_text(dsn, text, redacted):
    assert len(dsn_secrets(dsn)[0]) < log.MIN_SECRET_CHARS
    assert redact_text(text, dsn) == redacted


def test_redact_text_scrubs_the_percent_encoded_spellings_of_a_keyword_password():
    """A keyword DSN's password reaches SQLAlchemy percent-encoded (store.sqlalchemy_url)."""
    dsn = "host=h user=u password='p@ss w/rd' dbname=d"
    text = "at postgresql+psycopg://u:p%40ss%20w%2Frd@h/d and p%40ss+w%2Frd: refused"
    assert redact_text(text, dsn) == "at postgresql+psycopg://u:***@h/d and ***: refused"


DSN_RULE = (
    "dsn: a URI may hold '@' only once, between the user info and the host: percent-encode "
    "@ : / ? # in the user name and password (e.g. @ as %40)"
)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://op:Sup3r@S3cret/Path@127.0.0.1:55432/sched3",  # '@' then '/': libpq takes 'S3cret' as the host
        "postgresql://op:Sup3r?S3cret@127.0.0.1:55432/sched3",  # '?' ends the authority: '@' in the query
        "postgresql://op:Sup3r#S3cret@127.0.0.1:55432/sched3",  # '#': '@' in the fragment
        "postgresql://op:k3y@1@127.0.0.1:55432/sched3",
        "postgresql://op:S3cr@t!pw#x@127.0.0.1:55432/sched3",
        "postgresql://op:a@b@c-longersecret@127.0.0.1:55432/sched3",
        "postgres://op@127.0.0.1/sched3?application_name=a@b",
        "postgresql+psycopg://op:a@b@127.0.0.1/sched3",
        "cockroachdb://op:a@b@127.0.0.1:26257/sched3",
    ],
)
def test_a_uri_with_an_unescaped_at_is_refused_without_echoing_it(dsn):
    with pytest.raises(ConfigError) as caught:
        store.check_dsn(dsn)
    assert str(caught.value) == DSN_RULE


@pytest.mark.parametrize(
    "dsn, reason",
    [
        ("garbage", 'missing "=" after "garbage" in connection info string'),
        ("mysql://x:y@h:3306/db", 'missing "=" after "mysql://x:***@h:3306/db" in connection info string'),
        ("postgresql://u@h/db?sslmode", 'missing key/value separator "=" in URI query parameter: "sslmode"'),
        ("host=h password='s3cret-pw", "unterminated quoted string in connection info string"),
        ("host=h bogus=1 password=s3cret-pw", 'invalid connection option "bogus"'),
    ],
)
def test_a_dsn_libpq_cannot_parse_is_refused(dsn, reason):
    with pytest.raises(ConfigError) as caught:
        store.check_dsn(dsn)
    assert str(caught.value) == (
        "dsn: must be a URI (postgresql://user:password@host:5432/dbname) or libpq keywords "
        f"(host=... dbname=...); libpq: {reason}"
    )


@pytest.mark.parametrize(
    "dsn, port",
    [
        ("postgresql://u:s3cret@h:notaport/db", "notaport"),
        ("host=h port=x password=s3cret", "x"),
        ("postgresql://u@h1:5432,h2:abc/db", "abc"),
        ("host=h port=70000", "70000"),
        ("host=h port=0", "0"),
    ],
)
def test_a_dsn_port_that_is_not_a_tcp_port_is_refused(dsn, port):
    """libpq parses any port text and refuses it only when connecting, so ``config show``
    passed ``postgresql://u:…@h:notaport/db`` (a trial); each port of a DSN (one per host)
    must be a whole number from 1 to 65535."""
    with pytest.raises(ConfigError) as caught:
        store.check_dsn(dsn)
    assert str(caught.value) == f"dsn: each port must be a whole number from 1 to 65535 (got {port!r})"
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:pa%40ss%2F%3F%23@h:5432/db",
        "postgresql://u@h/db?password=s3cret&application_name=a%40b",
        "postgresql://u:p:a:ss@[::1]:5432/db",
        "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write",
        "postgresql+psycopg://u:pw@h/db",
        "cockroachdb://root@h:26257/db?sslmode=disable",
        "host=h user=u password=p@ss/w?rd#x dbname=d",
        "host=/var/run/postgresql dbname=d",
    ],
)
def test_a_well_formed_dsn_passes_the_check(dsn):
    store.check_dsn(dsn)


def test_a_text_value_escapes_every_control_character_in_every_record(captured):
    """``curl "$API/v1/x%1B%5B2J%1B%5B31mFAKE%07"`` was logged with its escape sequences raw
    (``path=/v1/x^[[2J^[[31mFAKE^G``: a terminal showing the log cleared and recoloured), and a
    NUL raw too: C0 controls, DEL and C1 controls were let through bare. Every value of every
    event is now quoted with each control character escaped as JSON would (``\\u001b``), so the
    quoted value still reads back with ``json.loads``."""
    configure, buffer = captured
    configure("text")
    hostile = "/v1/x\x1b[2J\x1b[31mFAKE\x07"
    log.event("api_request", path=hostile, status=401)
    log.event("tick_failed", logging.WARNING, error="a\x00b", other="del\x7fc1\x9b2J\x85end", plain="ok")
    lines = buffer.getvalue().splitlines()
    assert [line.split(" ", 2)[2].lstrip().split(" ", 1)[1] for line in lines] == [
        'path="/v1/x\\u001b[2J\\u001b[31mFAKE\\u0007" status=401',
        'error="a\\u0000b" other="del\\u007fc1\\u009b2J\\u0085end" plain=ok',
    ]
    assert not [c for c in buffer.getvalue() if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F]
    assert json.loads(lines[1].split(" other=", 1)[1].split(" plain=", 1)[0]) == "del\x7fc1\x9b2J\x85end"
    assert log.one_line("a\x1bb\x00\x7f\x9b\n") == "a\\x1bb\\x00\\x7f\\x9b\\n"


def test_the_api_servers_own_warnings_are_records_in_the_log_format(captured):
    """A trial: uvicorn's "Invalid HTTP request received." reached api.log as a bare line
    (Python's last-resort handler), not a record; it is a ``library_log`` record now."""
    configure, buffer = captured
    configure("json")
    logging.getLogger("uvicorn.error").warning("Invalid HTTP request received.")
    (record,) = [json.loads(line) for line in buffer.getvalue().splitlines()]
    assert (record["event"], record["level"], record["logger"], record["message"]) == (
        "library_log",
        "warning",
        "uvicorn.error",
        "Invalid HTTP request received.",
    )


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        # A third trial: a URL under a field the API does not know was echoed with its password.
        (
            "URL: is not a known field (got 'https://user:s3cret@93.184.216.34/hooks')",
            "URL: is not a known field (got 'https://user:***@93.184.216.34/hooks')",
        ),
        ("method: bad (got 'https://u:s3cret/x@h/')", "method: bad (got 'https://u:***@h/')"),
        ("redis://:s3cret@cache:6379/0 down", "redis://:***@cache:6379/0 down"),
        # A user alone is not a secret: a DSN to copy keeps it; so is a help text's placeholder.
        ("postgresql://postgres@127.0.0.1:5432/db", "postgresql://postgres@127.0.0.1:5432/db"),
        ("a URI (postgresql://user:password@host:5432/dbname)", "a URI (postgresql://user:password@host:5432/dbname)"),
    ],
)
def test_a_password_in_any_url_never_reaches_output(text, redacted):
    assert log.redact(text) == redacted
