"""The ``scheduler`` command line (click).

Every option can also come from an environment variable: the store and node
settings from ``SCHEDULER_<SETTING>`` (``SCHEDULER_DSN``, ``SCHEDULER_LEASE_TTL_S``,
shown in ``--help``), every other option from
``SCHEDULER_<COMMAND>_<SUBCOMMAND>_<OPTION>``, the option's flag in upper
case (e.g. ``SCHEDULER_JOBS_ADD_TZ``, ``SCHEDULER_JOBS_ADD_INTERVAL``:
:class:`FlagNamedOption`). Errors are
one line on stderr: ``error: <field>: <rule>``, echoed inputs cut to 80
characters (:func:`scheduler.errors.clip`).

Exit status, one rule for every command:

* 0: done;
* 2: the request was wrong and nothing was done: bad input or settings, an
  unknown job, tenant or revision, a name conflict, a destructive request
  not confirmed, a store whose schema is missing or behind (the hint says
  ``run `scheduler db upgrade``);
* 1: the system failed: the store unreachable or failing after retries, a
  migration that failed (and ``verify`` finding a break, ``demo`` failing its audit).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import psycopg
import tzdata

from scheduler import __version__
from scheduler import log as logmod
from scheduler import settings as settings_mod
from scheduler.delivery.views import RUN_STATES
from scheduler.errors import (
    ECHO_MAX_CHARS,
    ConfigError,
    ConflictError,
    NotFoundError,
    SchedulerError,
    StoreError,
    ValidationError,
    clip,
)
from scheduler.planner import CATCHUP_WINDOW_S, DEFAULT_MISFIRE, MISFIRE_GRACE_S, MISFIRE_POLICIES
from scheduler.settings import MAX_FLEET_TIMING_S, Settings

EXIT_INVALID = 2
EXIT_FAILED = 1
DSN_HINT = "postgresql://user:password@localhost:5432/scheduler"
DSN_HELP = (
    f"Store URI, e.g. {DSN_HINT}; several hosts: "
    "postgresql://user@h1:5432,h2:5432/db?target_session_attrs=read-write "
    "(libpq: tried in turn; with target_session_attrs=read-write the first writable one is used; "
    "docs/operations.md)."
)
"""The help of every ``--dsn``: the single-host form and libpq's multi-host one."""


class FlagNamedOption(click.Option):
    """An option whose automatic environment variable is named after its flag, as
    the module doc says: ``--interval`` of ``jobs add`` reads
    ``SCHEDULER_JOBS_ADD_INTERVAL``, ``--json`` reads ``..._JSON`` (click's own
    name comes from the Python parameter: ``..._INTERVAL_S``, ``..._AS_JSON``).
    An explicit ``envvar`` (the settings' ``SCHEDULER_LEASE_TTL_S``, ...) is
    read first, as click does."""

    def auto_envvar(self, ctx: click.Context) -> str | None:
        """The automatic variable's name in ``ctx`` (None: none is read)."""
        flag = next((o for o in self.opts if o.startswith("--")), None)
        if not (self.allow_from_autoenv and ctx.auto_envvar_prefix and flag):
            return None
        return f"{ctx.auto_envvar_prefix}_{flag[2:].replace('-', '_').upper()}"

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        value = click.Parameter.resolve_envvar_value(self, ctx)
        if value is not None:
            return value
        name = self.auto_envvar(ctx)
        return (os.environ.get(name) or None) if name else None


option = functools.partial(click.option, cls=FlagNamedOption)
"""``click.option`` for every option of the CLI (:class:`FlagNamedOption`)."""


def _fail(message: str, status: int) -> None:
    click.echo(logmod.redact(f"error: {message}"), err=True)
    sys.exit(status)


_LONG_QUOTED = re.compile("'([^'\n]{" + str(ECHO_MAX_CHARS + 1) + ",})'")


def _usage_message(exc: click.UsageError) -> str:
    """click's message of a usage error, any long quoted input in it cut (:func:`clip`)
    (click's own refusal of a choice names the option's environment variable)."""
    hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
    return _LONG_QUOTED.sub(lambda m: clip(m.group(1)), exc.format_message()) + hint


def _environment_variable(param: click.Parameter | None, ctx: click.Context | None) -> str | None:
    """The environment variable ``param``'s value was taken from, or None (a flag, a default)."""
    if param is None or ctx is None or param.name is None:
        return None
    if ctx.get_parameter_source(param.name) is not click.core.ParameterSource.ENVIRONMENT:
        return None
    names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
    if isinstance(param, FlagNamedOption) and (auto := param.auto_envvar(ctx)):
        names.append(auto)
    return next((name for name in names if os.environ.get(name)), None)


def _set_by(message: str, origins: Sequence[str | None]) -> str:
    """``message``, then ``; set by A, B`` naming each distinct origin of the
    values it refuses (None: a flag or a default, skipped)."""
    named = list(dict.fromkeys(o for o in origins if o))
    return f"{message}; set by {', '.join(named)}" if named else message


class FieldType(click.ParamType):
    """Base of the CLI's value types: a refusal (a ValidationError naming the
    field) of a value taken from an environment variable also names the
    variable (``port: must be a whole number … (got 'x'); set by
    SCHEDULER_API_PORT``, a ConfigError, exit status 2)."""

    def __call__(self, value: Any, param: click.Parameter | None = None, ctx: click.Context | None = None) -> Any:
        try:
            return super().__call__(value, param, ctx)
        except ValidationError as exc:
            variable = _environment_variable(param, ctx)
            if variable is None:
                raise
            raise ConfigError(_set_by(str(exc), [variable])) from None


class Choice(click.Choice):
    """click's Choice, whose refusal names the field and the rule as every other
    value's does (``misfire: must be one of … (got 'sometimes')``, a ValidationError,
    exit status 2), and, for a value taken from an environment variable, the variable
    too, as :class:`FieldType` does: ``dialect: must be one of unix, seconds (got
    'weird'); set by SCHEDULER_JOBS_ADD_DIALECT`` (ConfigError). click's own message
    named the flag, even when it was not given."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            if param is None or param.name is None:
                raise
            rule = f"must be one of {', '.join(map(str, self.choices))}"
            variable = _environment_variable(param, ctx)
            if variable is None:
                raise ValidationError(param.name, rule, value) from None
            raise ConfigError(_set_by(f"{param.name}: {rule} (got {clip(str(value))})", [variable])) from None


class ExistingFile(click.Path):
    """click's Path of an existing, readable file (not a directory), whose refusal
    names the field and the rule (``csv_file: must be an existing, readable file (got
    '/x.csv')``, a ValidationError, exit status 2) instead of click's ``Invalid value
    for 'CSV_FILE'``."""

    def __init__(self, path_type: type = Path) -> None:
        super().__init__(exists=True, dir_okay=False, readable=True, path_type=path_type)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            if param is None or param.name is None:
                raise
            raise ValidationError(param.name, "must be an existing, readable file", str(value)) from None


_LEADING_FIELD = re.compile(r"([a-z][a-z0-9_]*): ")


def _where_set(ctx: click.Context, field: str) -> str | None:
    """Where the value of ``field`` (a refusal's field: ``tz``, ``dsn``, ...) came from in
    ``ctx``'s command, if not from its flag or default: a node setting's variable or
    config file (:func:`_origin`), else the variable of the option named ``--<field>``
    or whose parameter is ``field``. None if no option has that name."""
    sources, config_path = ctx.meta.get("scheduler.settings_origin", ({}, None))
    if field in sources:
        return _origin(field, sources[field], config_path)
    flag = "--" + field.replace("_", "-")
    for param in ctx.command.params:
        if isinstance(param, click.Option) and (param.name == field or flag in param.opts):
            return _environment_variable(param, ctx)
    return None


class SourcedCommand(click.Command):
    """A command whose refusal of a value taken from an environment variable (or a node
    setting's config file) names it: ``tz: unknown time zone 'Mars/X'; set by
    SCHEDULER_JOBS_ADD_TZ`` (the command's body checks the value, after click parsed
    it: :class:`FieldType` covers values refused while parsing). Raises the refusal
    as a ConfigError when it names a variable (exit status 2 either way)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ValidationError, ConfigError) as exc:
            message = str(exc)
            if isinstance(exc, ValidationError):
                field: str | None = exc.field
            else:
                leading = _LEADING_FIELD.match(message)
                field = leading.group(1) if leading and "; set by " not in message else None
            where = _where_set(ctx, field) if field else None
            if where is None:
                raise
            raise ConfigError(_set_by(message, [where])) from None


class OneLineErrors(click.Group):
    """A group whose commands report errors as one line instead of usage text
    (its commands are :class:`SourcedCommand`, its groups OneLineErrors)."""

    command_class = SourcedCommand

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.Exit:
            raise
        except click.UsageError as exc:
            _fail(_usage_message(exc), EXIT_INVALID)
        except (ValidationError, ConfigError, ConflictError, NotFoundError) as exc:
            _fail(str(exc), EXIT_INVALID)
        except StoreError as exc:
            _fail(str(exc), EXIT_FAILED)
        except psycopg.errors.UndefinedTable as exc:
            _fail(
                f"store: the schema is missing or old ({str(exc).strip().splitlines()[0]}); "
                "run `scheduler db upgrade` first",
                EXIT_INVALID,
            )
        except psycopg.Error as exc:
            _fail(f"store: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}", EXIT_FAILED)
        except SchedulerError as exc:
            _fail(str(exc), EXIT_FAILED)

    def main(self, args: Any = None, prog_name: str | None = None, **extra: Any) -> Any:
        """Run without click's standalone handling so errors stay one line."""
        extra.pop("standalone_mode", None)
        try:
            status = super().main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
        except click.exceptions.Abort:
            _fail("aborted", EXIT_FAILED)
        except click.UsageError as exc:
            _fail(_usage_message(exc), EXIT_INVALID)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except (ValidationError, ConfigError) as exc:  # the root group's options, parsed before invoke
            _fail(str(exc), EXIT_INVALID)
        sys.exit(status if isinstance(status, int) else 0)


def group(**kwargs: Any) -> Callable:
    return click.group(cls=OneLineErrors, **kwargs)


MAX_LIST_LIMIT = 1_000_000
"""Most rows a ``--limit`` of ``jobs list``, ``runs list`` and ``runs redrive`` may ask for
(beyond PostgreSQL's bigint, an unbounded one reached the store as an error)."""


class WholeNumber(FieldType):
    """A click type: a whole number in ASCII digits (:func:`scheduler.spec.parse_whole`).

    ``int("٦٠")`` is 60 in Python; this type refuses it, and parses huge
    values as integers (never through float). ``lo``/``hi`` bound it; a
    refusal is a ValidationError naming ``field`` (exit status 2), with one
    rule for every refusal when both bounds are given ("must be a whole
    number from 1 to 1000 in ASCII digits").
    """

    name = "integer"

    def __init__(self, field: str, lo: int | None = None, hi: int | None = None) -> None:
        self.field, self.lo, self.hi = field, lo, hi

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from scheduler.spec import parse_whole

        rule = (
            None
            if self.lo is None or self.hi is None
            else f"must be a whole number from {self.lo} to {self.hi} in ASCII digits"
        )
        return parse_whole(self.field, value, minimum=self.lo, maximum=self.hi, rule=rule)


def limit_option(default: int, what: str) -> Callable[[Any], Any]:
    """The ``--limit`` option of a listing command: a whole number from 1 to
    :data:`MAX_LIST_LIMIT`, ``default`` shown; ``what`` starts its help."""
    return option(
        "--limit",
        default=default,
        show_default=True,
        type=WholeNumber("limit", 1, MAX_LIST_LIMIT),
        help=f"{what} (1 to {MAX_LIST_LIMIT:,}).",
    )


class Seconds(FieldType):
    """A click type: a duration field of a job spec in whole seconds, ASCII digits,
    bounded as :data:`scheduler.spec.SECONDS_FIELDS` says (:func:`scheduler.spec.parse_seconds`)."""

    name = "seconds"

    def __init__(self, field: str) -> None:
        self.field = field

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from scheduler.spec import parse_seconds

        return parse_seconds(self.field, value)


class Decimal(FieldType):
    """A click type: a number in ASCII decimal notation (:func:`scheduler.spec.parse_decimal`),
    within ``[low, high]`` when given; ``rule`` is the message of a refusal (a
    ValidationError naming ``field``, echoing the value as typed)."""

    name = "number"

    def __init__(
        self, field: str, rule: str | None = None, low: float | None = None, high: float | None = None
    ) -> None:
        self.field, self.rule, self.low, self.high = field, rule, low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        from scheduler.spec import parse_decimal

        number = parse_decimal(self.field, value, rule=self.rule)
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            raise ValidationError(self.field, self.rule or f"must be from {self.low:g} to {self.high:g}", value)
        return number


class FleetSeconds(Decimal):
    """A click type: one of the fleet's timings (``status``, ``verify``), seconds > 0 and at
    most :data:`~scheduler.settings.MAX_FLEET_TIMING_S`, as the admin API and a node's
    settings take them (NaN, infinities and exponents past it refused, naming ``field``)."""

    def __init__(self, field: str) -> None:
        super().__init__(field, f"must be a number of seconds > 0 and <= {MAX_FLEET_TIMING_S} in ASCII digits")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):  # the default, a node setting
            return value
        number = super().convert(value, param, ctx)
        if not 0 < number <= MAX_FLEET_TIMING_S:
            raise ValidationError(self.field, self.rule or "", value)
        return number


WEIGHT = WholeNumber("weight", 1, 1000)
MAX_RATE = Decimal(
    "max_rate", "must be a number of runs per second > 0 and <= 1000000000 in ASCII digits", high=1e9
)  # the bound is scheduler.jobs.MAX_TENANT_RATE (that module is imported lazily)
MAX_SCHEDULES = WholeNumber("max_schedules", 0, 100_000_000)


def _stdin_is_tty() -> bool:
    """True if a person can be asked (stdin is a terminal)."""
    return sys.stdin.isatty()


def _confirm(question: str, yes: bool, refusal: str, declined: str) -> None:
    """Go on if ``yes``, else ask ``question`` on a terminal (default no).

    Raises ValidationError (field ``yes``, exit status 2) with rule
    ``refusal`` if there is no terminal to ask on, ``declined`` if the
    answer is no.
    """
    if yes:
        return
    if not _stdin_is_tty():
        raise ValidationError("yes", refusal)
    if not click.confirm(question, default=False):
        raise ValidationError("yes", declined)


def instant(field: str) -> Callable[[click.Context, click.Parameter, str | None], datetime | None]:
    """A click callback parsing ISO-8601 with an offset (naive rejected)."""
    from scheduler.schedule import parse_instant

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
        return None if value is None else parse_instant(value, field)

    return callback


def _register_dsn(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> str | None:
    """Click callback: remember the DSN's password so no output ever shows it (scheduler.log.redact)."""
    from scheduler.store import dsn_secrets

    if value:
        logmod.add_secret(*dsn_secrets(value))
    return value


def dsn_option(func: Callable) -> Callable:
    return option(
        "--dsn",
        envvar="SCHEDULER_DSN",
        show_envvar=True,
        default="",
        callback=_register_dsn,
        help=DSN_HELP,
    )(func)


def json_option(func: Callable) -> Callable:
    return option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(func)


def _need_dsn(dsn: str) -> None:
    """Raise ConfigError (exit status 2) if no DSN is set; else remember its password (never printed)."""
    if not dsn:
        raise ConfigError(f"dsn: no store configured; pass --dsn or set SCHEDULER_DSN (e.g. {DSN_HINT})")
    _register_dsn(None, None, dsn)


def open_store(dsn: str) -> psycopg.Connection:
    """Connect for a CLI command and check the store can be used, as a node does at start.

    :func:`scheduler.store.open_usable` classifies: exit status 2 for a bad
    setting (no DSN, a malformed one, authentication refused, the database
    absent) or a schema missing or behind head (a newer one is used), 1 for
    a store that cannot be reached.
    """
    from scheduler import store
    from scheduler.migrate import script_revisions

    _need_dsn(dsn)
    return store.open_usable(lambda: store.connect(dsn, application_name="scheduler-cli"), dsn, script_revisions())


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=_json_default))


def _json_default(value: Any) -> Any:
    from scheduler.schedule import format_instant

    if isinstance(value, datetime):
        return format_instant(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(type(value).__name__)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return _json_default(value) if isinstance(value, (datetime, uuid.UUID)) else str(value)


def _table(rows: list[dict], columns: list[str]) -> None:
    cells = [[_fmt(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=False)).rstrip())
    for r in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)).rstrip())


# ---------------------------------------------------------------- root


@group(
    context_settings={
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
        "auto_envvar_prefix": "SCHEDULER",
    }
)
@click.version_option(
    __version__, prog_name="scheduler", message=f"%(prog)s, version %(version)s (tzdata {tzdata.IANA_VERSION})"
)
@option(
    "--log-format",
    type=Choice(["text", "json"]),
    default="text",
    envvar="SCHEDULER_LOG_FORMAT",
    show_envvar=True,
    show_default=True,
    help="Log record format (stderr).",
)
@option(
    "--log-level",
    type=Choice(["debug", "info", "warning", "error"]),
    default="info",
    envvar="SCHEDULER_LOG_LEVEL",
    show_envvar=True,
    show_default=True,
    help="Least severe log records written (stderr).",
)
@click.pass_context
def cli(ctx: click.Context, log_format: str, log_level: str) -> None:
    """Distributed trigger engine: fires cron, interval and one-shot timers from a SQL store.

    Start with `scheduler demo` (needs no database), or point --dsn /
    SCHEDULER_DSN at PostgreSQL and run `scheduler db upgrade`, then
    `scheduler jobs add ...` and `scheduler node`.
    """
    logmod.configure(log_format, log_level)
    # `scheduler --log-format json node ...` counts as a flag of the node's settings.
    ctx.obj = {
        "root_flags": {
            name: ctx.params[name]
            for name in ("log_format", "log_level")
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
        }
    }


# ---------------------------------------------------------------- db


@cli.group(cls=OneLineErrors)
def db() -> None:
    """Schema migrations (alembic)."""


@db.command("upgrade")
@dsn_option
@click.argument("revision", required=False)
@option("--revision", "revision_option", default=None, help="Same as REVISION.")
def db_upgrade(dsn: str, revision: str | None, revision_option: str | None) -> None:
    """Migrate the store's schema up to REVISION (default: head). Safe to re-run.

    REVISION is an id (`scheduler db current` shows the store's), `head`, or
    +N (N revisions up); one below the store's revision exits 2 (that is
    `scheduler db downgrade`). The DSN may be a URI or libpq keywords (host=... dbname=...).
    """
    from scheduler.migrate import upgrade

    if revision is not None and revision_option is not None:
        raise ValidationError("revision", "give it as REVISION or --revision, not both")
    revision = revision or revision_option or "head"
    _need_dsn(dsn)
    done = upgrade(dsn, revision)
    click.echo(f"schema at {done.target_text}")


@db.command("downgrade")
@dsn_option
@click.argument("revision")
@option("--yes", is_flag=True, help="Confirm a downgrade of a store that holds live jobs.")
def db_downgrade(dsn: str, revision: str, yes: bool) -> None:
    """Migrate the schema down to REVISION: an id, -N (N revisions down) or 'base' (drops every table: data is lost).

    A store that holds live (not deleted) jobs is downgraded only with
    --yes; without it the command says how many jobs are at stake and
    exits 2, changing nothing. A store already at REVISION is left as it is
    (exit 0); a REVISION above the store's exits 2.
    """
    from scheduler.migrate import downgrade, live_job_count, plan

    _need_dsn(dsn)
    checked = plan(dsn, revision, "downgrade")  # ValidationError for an unknown or higher revision
    if checked.noop:
        click.echo(f"already at {checked.current or 'base'}")
        return
    live = live_job_count(dsn)
    if live and not yes:
        loss = "drops the jobs table and loses them" if checked.drops_jobs else "drops schema the running version needs"
        raise ValidationError(
            "yes", f"the store holds {live} live jobs; downgrading to {revision} {loss}: pass --yes to confirm"
        )
    done = downgrade(dsn, revision)
    click.echo(f"schema at {done.target_text}")


@db.command("current")
@dsn_option
@json_option
def db_current(dsn: str, as_json: bool) -> None:
    """Print the store's schema revision and whether it is the head (the newest this version knows)."""
    from scheduler.migrate import current_revision, head_revision, is_known

    _need_dsn(dsn)
    current, head = current_revision(dsn), head_revision()
    if as_json:
        _echo_json({"current": current, "head": head, "at_head": current == head})
    elif current == head:
        click.echo(f"{current} (head)")
    elif current is None:
        click.echo(f"none (empty database; head is {head}: run `scheduler db upgrade`)")
    elif not is_known(current):
        click.echo(f"{current} (unknown to this version, whose head is {head}: a newer version migrated it)")
    else:
        click.echo(f"{current} (behind head {head}: run `scheduler db upgrade`)")


# ---------------------------------------------------------------- tenants


@cli.group(cls=OneLineErrors)
def tenants() -> None:
    """Tenants: fairness weight, fleet-wide rate cap, schedule quota and push signing secrets."""


@tenants.command("add")
@dsn_option
@click.argument("tenant")
@option("--weight", type=WEIGHT, default=1, show_default=True, help="Fair-share weight (1-1000).")
@option("--max-rate", type=MAX_RATE, default=None, help="Fleet-wide cap in runs/s (default: none).")
def tenants_add(dsn: str, tenant: str, weight: int, max_rate: float | None) -> None:
    """Create TENANT (no-op if it exists)."""
    from scheduler import jobs

    with open_store(dsn) as conn:
        created = jobs.add_tenant(conn, tenant, weight, max_rate)
    if created:
        click.echo(f"tenant {tenant} created")
    else:
        click.echo(f"tenant {tenant} exists (unchanged; use `scheduler tenants set {tenant}` to change it)")


@tenants.command("set")
@dsn_option
@click.argument("tenant")
@option("--weight", type=WEIGHT, default=None, help="Fair-share weight (1-1000).")
@option("--max-rate", type=MAX_RATE, default=None, help="Fleet-wide cap in runs/s.")
@option("--no-max-rate", is_flag=True, help="Remove the rate cap.")
@option(
    "--max-schedules",
    type=MAX_SCHEDULES,
    default=None,
    help="Quota: live schedules the API's PUT and apply may leave TENANT with "
    "(default when unset: 10000; the CLI's own jobs add/import are not limited).",
)
@option("--no-max-schedules", is_flag=True, help="Back to the default schedule quota.")
def tenants_set(
    dsn: str,
    tenant: str,
    weight: int | None,
    max_rate: float | None,
    no_max_rate: bool,
    max_schedules: int | None,
    no_max_schedules: bool,
) -> None:
    """Change TENANT's weight, rate cap and/or schedule quota."""
    from scheduler import jobs

    if weight is None and max_rate is None and not no_max_rate and max_schedules is None and not no_max_schedules:
        raise click.UsageError("give --weight, --max-rate, --no-max-rate, --max-schedules or --no-max-schedules")
    if max_rate is not None and no_max_rate:
        raise click.UsageError("--max-rate and --no-max-rate contradict each other: give one")
    if max_schedules is not None and no_max_schedules:
        raise click.UsageError("--max-schedules and --no-max-schedules contradict each other: give one")
    with open_store(dsn) as conn:
        row = jobs.set_tenant(
            conn,
            tenant,
            weight=weight,
            max_rate=max_rate,
            clear_max_rate=no_max_rate,
            max_schedules=max_schedules,
            clear_max_schedules=no_max_schedules,
        )
    quota = "default" if row["max_schedules"] is None else row["max_schedules"]
    click.echo(f"tenant {row['tenant']} weight={row['weight']} max_rate={_fmt(row['max_rate'])} max_schedules={quota}")


@tenants.command("list")
@dsn_option
@json_option
def tenants_list(dsn: str, as_json: bool) -> None:
    """List tenants with their weight, rate cap and job count."""
    from scheduler import jobs

    with open_store(dsn) as conn:
        rows = jobs.list_tenants(conn)
    if as_json:
        _echo_json(rows)
    else:
        _table(rows, ["tenant", "weight", "max_rate", "max_schedules", "jobs", "created_at"])


@tenants.group("secret", cls=OneLineErrors)
def tenants_secret() -> None:
    """Signing secrets of the tenant's pushed requests (header Scheduler-Signature)."""


@tenants_secret.command("rotate")
@dsn_option
@click.argument("tenant")
@option(
    "--grace",
    default="24h",
    show_default=True,
    help="How long the previous secrets stay valid at most (one expiring sooner keeps its expiry): "
    "24h, 30m, 1d, seconds, or 0 (end them now); at most 30d.",
)
@json_option
def tenants_secret_rotate(dsn: str, tenant: str, grace: str, as_json: bool) -> None:
    """Create a new signing secret for TENANT and print it ONCE (it cannot be shown again).

    Requests are signed with every valid secret, newest first, so a receiver
    keeps working while it is switched to the new one within the grace.
    """
    from scheduler.delivery import tenant_secrets

    grace_s = tenant_secrets.parse_grace(grace)
    with open_store(dsn) as conn:
        secret_id, secret, created_at, limited = tenant_secrets.rotate(conn, tenant, grace_s)
    if as_json:
        _echo_json({"tenant": tenant, "secret_id": secret_id, "secret": secret, "created_at": created_at})
    else:
        click.echo(secret)
        # Nothing said of previous secrets when none was valid (a tenant's first secret).
        previous = "stop being valid now" if grace_s == 0 else f"valid for {grace.strip()} more"
        previous = f"; previous secrets {previous}" if limited else ""
        click.echo(
            f"secret {secret_id} of tenant {tenant} created{previous}. Store it now: it is not shown again.",
            err=True,
        )


@tenants_secret.command("list")
@dsn_option
@click.argument("tenant")
@json_option
def tenants_secret_list(dsn: str, tenant: str, as_json: bool) -> None:
    """List TENANT's signing secrets (ids, created, expires, valid), never their values."""
    from scheduler.delivery import tenant_secrets

    with open_store(dsn) as conn:
        rows = tenant_secrets.list_secrets(conn, tenant)
    if as_json:
        _echo_json(rows)
    else:
        _table(rows, ["secret_id", "created_at", "expires_at", "valid"])


# ---------------------------------------------------------------- keys


@cli.group(cls=OneLineErrors)
def keys() -> None:
    """API keys of the tenant HTTP API (docs/api.md, "Keys")."""


@keys.command("create")
@dsn_option
@option(
    "--tenant",
    default=None,
    help="The key's tenant, which must exist (`scheduler tenants add T` creates it, as `jobs add` does); "
    "omit it for --role admin.",
)
@option(
    "--role",
    required=True,
    type=Choice(["admin", "tenant", "worker"]),
    help="admin: tenants, keys, status, verify; tenant: its schedules and runs; worker: claim/ack its runs.",
)
@option("--name", default=None, help="A label to recognize the key by in `keys list`.")
def keys_create(dsn: str, tenant: str | None, role: str, name: str | None) -> None:
    """Create a key and print its token ONCE on stdout, alone on its line (it cannot be read back).

    Use it as `Authorization: Bearer <token>`. The key's id and role go to stderr.
    A tenant that does not exist is refused (exit status 2), never created.
    """
    from scheduler.api import keys as api_keys

    with open_store(dsn) as conn:
        token, row = api_keys.create(conn, tenant, role, name)
    click.echo(
        f"key {row['key_id']} created (role {row['role']}"
        + (f", tenant {row['tenant']}" if row["tenant"] else "")
        + "); the token below is shown once",
        err=True,
    )
    click.echo(token)


@keys.command("list")
@dsn_option
@option("--tenant", default=None, help="Only this tenant's keys.")
@json_option
def keys_list(dsn: str, tenant: str | None, as_json: bool) -> None:
    """List keys (id, tenant, role, name, times); never a secret or its hash."""
    from scheduler.api import keys as api_keys

    rows: list[dict] = []
    with open_store(dsn) as conn:
        while True:
            page = api_keys.list_keys(conn, tenant, after=rows[-1]["key_id"] if rows else None, limit=1000)
            rows.extend(page)
            if len(page) < 1000:
                break
    if as_json:
        _echo_json(rows)
    else:
        _table(rows, ["key_id", "tenant", "role", "name", "created_at", "revoked_at", "last_used_at"])


@keys.command("revoke")
@dsn_option
@click.argument("key_id")
def keys_revoke(dsn: str, key_id: str) -> None:
    """Revoke KEY_ID: every API process refuses it within a second (again: no change)."""
    from scheduler.api import keys as api_keys

    with open_store(dsn) as conn:
        row = api_keys.revoke(conn, key_id)
    click.echo(f"key {row['key_id']} revoked at {_fmt(row['revoked_at'])}")


# ---------------------------------------------------------------- jobs


@cli.group(cls=OneLineErrors)
def jobs() -> None:
    """Register, inspect and manage timers."""


def _schedule_options(func: Callable) -> Callable:
    options = [
        option("--cron", default=None, help="Cron expression (see --dialect)."),
        option("--tz", default=None, help="IANA time zone of the cron expression [default: UTC]."),
        option(
            "--dialect",
            type=Choice(["unix", "seconds"]),
            default=None,
            help="unix: 5 fields (default; Vixie day rule: OR unless a day field starts with *); "
            "seconds: 6 fields, seconds first (Spring: day fields combine with AND). "
            "A day field ? means *.",
        ),
    ]
    for decorate in reversed(options):
        func = decorate(func)
    return func


def push_allow_option(func: Callable) -> Callable:
    return option(
        "--push-allow",
        envvar="SCHEDULER_PUSH_ALLOW",
        show_envvar=True,
        default="",
        help="Networks a --url target may reach beyond the public internet (the node setting "
        "push_allow), e.g. 10.0.0.0/8,127.0.0.1/32; without it, a URL whose host resolves to a "
        "loopback, private, link-local or metadata address is refused. This checks the URL when "
        "the job is saved only: the node checks it again at connect time with its own push_allow, "
        "so start the nodes with the same allowlist, else every attempt fails, not retried "
        "('ssrf refused').",
    )(func)


def _push_policy(push_allow: str) -> Any:
    from scheduler.delivery.ssrf import AddressPolicy

    return AddressPolicy.parse(push_allow)


def _read_payload_file(path: str) -> bytes:
    """The bytes of ``--payload-file`` (``-``: stdin), read no further than the input limit
    (a larger input is refused by :func:`scheduler.delivery.targets.parse_payload` with its size)."""
    from scheduler.delivery.targets import MAX_PAYLOAD_INPUT_BYTES

    limit = MAX_PAYLOAD_INPUT_BYTES + 1
    if path == "-":
        data = sys.stdin.buffer.read(limit)
    else:
        try:
            with open(path, "rb") as handle:
                data = handle.read(limit)
        except OSError as exc:
            raise ValidationError("payload_file", f"cannot read it ({exc.strerror or exc})", path) from None
    return data.removeprefix(b"\xef\xbb\xbf")  # a byte order mark (editors on Windows) is not JSON


def _delivery_options(func: Callable) -> Callable:
    from scheduler.delivery import targets as t

    options = [
        option(
            "--queue",
            default=None,
            help="Target: a queue of the tenant, which workers claim from (1-100 letters, digits, . _ -)  "
            f"[default: {t.DEFAULT_QUEUE}].",
        ),
        option(
            "--url",
            metavar="URL",
            default=None,
            help="Target: an http(s) endpoint the engine pushes each run to (instead of a queue). Its host "
            "must resolve to public addresses (see --push-allow); no user:password in it.",
        ),
        option(
            "--method",
            metavar=f"[{'|'.join(t.METHODS)}]",
            default=None,
            help=f"HTTP method of a --url target, in any case  [default: {t.DEFAULT_METHOD}].",
        ),
        option(
            "--header",
            "headers",
            metavar="'NAME: VALUE'",
            multiple=True,
            help=f"'Name: value' sent with every push of a --url target; repeatable, at most {t.MAX_HEADERS}. "
            "Host, Content-*, Transfer-Encoding, Connection, Idempotency-Key and Scheduler-* are the "
            "engine's. Values are never printed (jobs show lists names only).",
        ),
        option(
            "--timeout-s",
            metavar="SECONDS",
            default=None,
            help=f"Per-attempt timeout of a --url target in seconds, 0 < t <= {t.MAX_TIMEOUT_S:g}  "
            f"[default: {t.DEFAULT_TIMEOUT_S:g}].",
        ),
        option(
            "--payload",
            metavar="JSON",
            default=None,
            help="JSON delivered with every attempt (a worker's run.payload, a push's body); at most "
            f"{t.MAX_PAYLOAD_BYTES:,} bytes as compact UTF-8 JSON.",
        ),
        option(
            "--payload-file",
            metavar="PATH",
            default=None,
            help="Read the --payload JSON from this file ('-': stdin).",
        ),
        option(
            "--max-attempts",
            metavar="N",
            default=None,
            help=f"Attempts of a run before it is dead, 1-{t.MAX_ATTEMPTS}  [default: {t.DEFAULT_MAX_ATTEMPTS}].",
        ),
        option(
            "--backoff-base-s",
            metavar="SECONDS",
            default=None,
            help="Retry backoff: attempt n waits up to base * 2^(n-1) seconds (full jitter), "
            f"0 < base <= cap  [default: {t.DEFAULT_BACKOFF_BASE_S:g}].",
        ),
        option(
            "--backoff-cap-s",
            metavar="SECONDS",
            default=None,
            help=f"Longest retry backoff in seconds, at most {t.MAX_BACKOFF_S:g}  "
            f"[default: {t.DEFAULT_BACKOFF_CAP_S:g}].",
        ),
        option(
            "--max-age-s",
            metavar="DURATION",
            default=None,
            help="No retry starts later than this after the first attempt: seconds or 90m, 12h, 7d, 1d12h; "
            "at most 30d  [default: unset].",
        ),
        option(
            "--overlap",
            type=Choice(t.OVERLAP_POLICIES),
            default=None,
            help="A run due while the previous one is unfinished: allow (run both), forbid (skip the new), "
            "buffer_one (keep one waiting), replace (cancel the old)  "
            f"[default: {t.DEFAULT_OVERLAP}].",
        ),
    ]
    for decorate in reversed(options):
        func = decorate(func)
    return func


owning_tenant_option = option(
    "--tenant",
    required=True,
    envvar="SCHEDULER_TENANT",
    show_envvar=True,
    help="Owning tenant; created (weight 1) if it does not exist: check the spelling.",
)
"""The ``--tenant`` of ``jobs add`` and ``jobs import``, which create a tenant they do not find."""


@jobs.command("add")
@dsn_option
@owning_tenant_option
@_schedule_options
@option(
    "--interval",
    "interval_s",
    type=Seconds("interval"),
    default=None,
    help="Fixed interval in whole seconds (elapsed time).",
)
@option(
    "--at",
    "at",
    default=None,
    callback=instant("at"),
    help="One-shot instant, ISO-8601 with offset (2030-01-01T09:00:00Z).",
)
@option(
    "--name",
    default=None,
    help="Unique per tenant; makes the call idempotent. A named job is an API schedule "
    "(an API apply with prune that does not list it deletes it).",
)
@option("--replace", is_flag=True, help="With --name: change an existing job whose spec differs.")
@option(
    "--misfire",
    type=Choice(MISFIRE_POLICIES),
    default=DEFAULT_MISFIRE,
    show_default=True,
    help="Catch-up policy for overdue slots (all: every slot within --catchup-window-s; "
    "once: one run for all; skip: drop slots later than --misfire-grace-s).",
)
@option(
    "--catchup-window-s",
    type=Seconds("catchup_window_s"),
    default=None,
    help=f"Window of the 'all' policy (only): slots older are skipped  [default: {CATCHUP_WINDOW_S}].",
)
@option(
    "--misfire-grace-s",
    type=Seconds("misfire_grace_s"),
    default=None,
    help=f"Grace of the 'once' and 'skip' policies (not 'all')  [default: {MISFIRE_GRACE_S}].",
)
@option(
    "--jitter",
    "jitter_s",
    type=Seconds("jitter"),
    default=0,
    show_default=True,
    help="Deterministic delay of up to this many seconds per run.",
)
@_delivery_options
@push_allow_option
def jobs_add(
    dsn: str,
    tenant: str,
    cron: str | None,
    tz: str | None,
    dialect: str | None,
    interval_s: str | None,
    at: datetime | None,
    name: str | None,
    replace: bool,
    misfire: str,
    catchup_window_s: Any,
    misfire_grace_s: Any,
    jitter_s: Any,
    queue: str | None,
    url: str | None,
    method: str | None,
    headers: tuple[str, ...],
    timeout_s: str | None,
    payload: str | None,
    payload_file: str | None,
    max_attempts: str | None,
    backoff_base_s: str | None,
    backoff_cap_s: str | None,
    max_age_s: str | None,
    overlap: str | None,
    push_allow: str,
) -> None:
    """Register a timer and print its id.

    Exactly one of --cron, --interval, --at. A tenant that does not exist yet
    is created. --catchup-window-s with --misfire once/skip, or
    --misfire-grace-s with --misfire all, is refused (the policy ignores it).

    Its runs go to --queue (default `default`) or to --url (then --method,
    --header, --timeout-s), carry --payload, are retried per --max-attempts,
    --backoff-base-s, --backoff-cap-s, --max-age-s, and overlap per --overlap
    (docs/delivery.md). Changing any of these under --name is an edit: it
    needs --replace.
    """
    from scheduler import jobs as jobsmod
    from scheduler.delivery.targets import DeliverySpec
    from scheduler.spec import JobSpec

    if payload is not None and payload_file is not None:
        raise ValidationError("payload", "give --payload or --payload-file, not both")
    policy = _push_policy(push_allow)
    delivery = DeliverySpec.build(
        queue=queue,
        url=url,
        method=method,
        headers=list(headers) or None,
        timeout_s=timeout_s,
        payload=_read_payload_file(payload_file) if payload_file is not None else payload,
        max_attempts=max_attempts,
        backoff_base_s=backoff_base_s,
        backoff_cap_s=backoff_cap_s,
        max_age_s=max_age_s,
        overlap=overlap,
    )

    spec = JobSpec.build(
        tenant=tenant,
        cron=cron,
        tz=tz,
        dialect=dialect,
        interval_s=interval_s,
        at=at,
        name=name,
        misfire=misfire,
        catchup_window_s=catchup_window_s,
        misfire_grace_s=misfire_grace_s,
        jitter_s=jitter_s,
        delivery=delivery,
    )
    if replace and name is None:
        raise ValidationError("replace", "needs --name (the job to replace)")
    with open_store(dsn) as conn:
        result = jobsmod.add_job(conn, spec, replace=replace, push_policy=policy)
    click.echo(str(result.job_id))
    if result.outcome != "created":
        click.echo(f"({result.outcome})", err=True)


@jobs.command("import")
@dsn_option
@click.argument("csv_file", type=ExistingFile())
@owning_tenant_option
@option("--misfire", type=Choice(MISFIRE_POLICIES), default=DEFAULT_MISFIRE, show_default=True)
@option(
    "--name-column",
    default=None,
    help="Take each job's name from this CSV column [default: a name derived from the line].",
)
@push_allow_option
@json_option
def jobs_import(
    dsn: str, csv_file: Path, tenant: str, misfire: str, name_column: str | None, push_allow: str, as_json: bool
) -> None:
    """Bulk-import cron schedules from CSV_FILE (columns expr, dialect, timezone, ...); idempotent.

    The dialect column takes `unix` or `seconds` (also the corpus's unix5 and
    macro as `unix`, seconds6 as `seconds`); anything else is tried as
    `unix`; an empty timezone means UTC; a UTF-8
    byte order mark is skipped. Every line becomes a named job: the
    --name-column value, else `import:<hash of tenant, expr, dialect,
    zone>:<n-th such line>`. Importing again creates only the lines whose
    name is new: the others are `unchanged` (same spec) or rejected (their
    name's job has another spec; delete it first). Invalid lines are
    reported (line, expression, reason) and every valid line is imported.
    Imported jobs are named schedules of the tenant for the HTTP API: a
    `POST /v1/schedules:apply` with prune deletes every one it does not list.
    Exit status 0 when any line was imported (or found unchanged), even with
    rejected lines (count them in the summary line or --json); 2 when every
    line was rejected (the report is printed as usual) or the file itself is
    unusable (unreadable, no expr column).

    Optional delivery columns, named as the `jobs add` options (an empty
    cell is the default): queue, url, method, headers ('Name: value' lines
    in one quoted cell), timeout_s, payload (JSON), max_attempts,
    backoff_base_s, backoff_cap_s, max_age_s, overlap. A line whose values
    differ from its job's is rejected like a different schedule. Any other
    column (but the corpus's source_kind, repo, path, read and not used), or
    a column named twice, refuses the file: nothing is imported.
    """
    from scheduler import jobs as jobsmod

    policy = _push_policy(push_allow)
    with open_store(dsn) as conn:
        report = jobsmod.import_csv(
            conn, csv_file, tenant, misfire=misfire, name_column=name_column, push_policy=policy
        )
    if as_json:
        _echo_json(
            {
                "created": len(report.created),
                "unchanged": len(report.unchanged),
                "rejected": [{"line": n, "expr": e, "reason": r} for n, e, r in report.rejected],
            }
        )
    else:
        for line, expr, reason in report.rejected:
            click.echo(f"{csv_file}:{line}: {clip(expr)}: {reason}", err=True)
        click.echo(f"{len(report.created)} created, {len(report.unchanged)} unchanged, {len(report.rejected)} rejected")
    if report.rejected and not report.created and not report.unchanged:
        _fail(f"every line of {csv_file} was rejected: nothing imported", EXIT_INVALID)


@jobs.command("list")
@dsn_option
@option("--tenant", default=None)
@limit_option(1000, "At most this many jobs")
@json_option
def jobs_list(dsn: str, tenant: str | None, limit: int, as_json: bool) -> None:
    """List jobs (not deleted), by tenant and creation time; an unknown --tenant exits 2."""
    from scheduler import jobs as jobsmod

    with open_store(dsn) as conn:
        rows = jobsmod.list_jobs(conn, tenant, limit)
    from scheduler.delivery.targets import target_text

    for row in rows:
        row["schedule"] = _schedule_text(row)
        row["target"] = target_text(row)
        del row["url"], row["method"]  # the target says it (a URL's path and query may carry a token)
    if as_json:
        _echo_json(rows)
    else:
        _table(rows, ["job_id", "tenant", "name", "schedule", "target", "misfire", "paused", "next_nominal_at"])
    if len(rows) == limit:
        click.echo(f"(showing the first {limit} jobs; there may be more: raise --limit)", err=True)


def _state_text(row: dict) -> str | None:
    """A run's state as the text tables show it: a pending run without ``available_at`` is a
    ``buffer_one`` run held behind an unfinished one (``--json`` keeps the stored values)."""
    if row["state"] == "pending" and row.get("available_at", False) is None:
        return "pending (held: buffer_one)"
    return row["state"]


def _schedule_text(row: dict) -> str:
    if row["kind"] == "cron":
        dialect = "" if row["cron_dialect"] == "unix" else f" ({row['cron_dialect']})"
        return f"cron '{row['cron_expr']}' {row['tz']}{dialect}"
    if row["kind"] == "interval":
        return f"every {row['interval_s']}s"
    return f"once at {_fmt(row['fire_at'])}"


def _job_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValidationError("job_id", "must be a UUID", value) from None


@jobs.command("show")
@dsn_option
@click.argument("job_id")
@json_option
def jobs_show(dsn: str, job_id: str, as_json: bool) -> None:
    """Show one job: its row, schedule and delivery (header names only: values may be secrets)."""
    from scheduler import jobs as jobsmod

    with open_store(dsn) as conn:
        row = jobsmod.get_job(conn, _job_id(job_id))
        delivery = jobsmod.get_delivery(conn, row).describe()
    row["schedule"] = _schedule_text(row)
    if as_json:
        _echo_json({**row, "delivery": delivery})
    else:
        for key, value in row.items():
            click.echo(f"{key:17} {_fmt(value)}")
        for key, value in delivery.items():
            if key in row:  # queue, overlap: printed with the row
                continue
            if key == "payload" and value is not None:
                value = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            elif key == "header_names":
                value = ", ".join(value) or None
            click.echo(f"{key:17} {_fmt(value)}")


@jobs.command("describe")
@dsn_option
@click.argument("job_id")
@json_option
def jobs_describe(dsn: str, job_id: str, as_json: bool) -> None:
    """Show a job with its delivery: spec, target, policies, next 10 fires, last 10 runs, counters.

    The target shows header names only (values may be secrets) and the
    payload's size. Each recent run shows its run id (`runs redrive` takes
    it), state, attempts, lateness (fired - scheduled) and dispatch lag
    (first claim - scheduled). Counters:
    runs per delivery state (predelivery: fired before delivery existed),
    in flight (leased + failed), skipped slots per reason.
    """
    from scheduler.delivery.views import describe_job

    with open_store(dsn) as conn:
        described = describe_job(conn, _job_id(job_id))
    job = described["job"]
    job["schedule"] = _schedule_text(job)
    if as_json:
        _echo_json(described)
        return
    for key in ("job_id", "tenant", "name", "schedule", "misfire", "jitter_s", "paused", "deleted_at", "revision"):
        click.echo(f"{key:17} {_fmt(job[key])}")
    delivery = described["delivery"]
    target = delivery["target"]
    if "queue" in target:
        click.echo(f"{'target':17} queue {target['queue']}")
    else:
        names = ", ".join(target["header_names"]) or "-"
        click.echo(
            f"{'target':17} {target['method']} {target['url']} (headers: {names}; timeout {target['timeout_s']:g}s)"
        )
    payload = delivery["payload_bytes"]
    click.echo(f"{'payload':17} {'none' if payload is None else f'{payload} bytes'}")
    retry = delivery["retry"]
    max_age = "-" if retry["max_age_s"] is None else f"{retry['max_age_s']}s"
    click.echo(
        f"{'retry':17} max_attempts {retry['max_attempts']}, backoff {retry['backoff_base_s']:g}s"
        f" to {retry['backoff_cap_s']:g}s, max_age {max_age}"
    )
    click.echo(f"{'overlap':17} {delivery['overlap']}")
    click.echo("next fires:")
    for fire in described["next_fires"]:
        jittered = "" if fire["scheduled_at"] == fire["nominal_time"] else f" (scheduled {_fmt(fire['scheduled_at'])})"
        click.echo(f"  {_fmt(fire['nominal_time'])}{jittered}")
    if not described["next_fires"]:
        click.echo("  none (paused, deleted or no slot left)")
    click.echo("recent runs:")
    if described["recent_runs"]:
        rows = [
            {
                **run,
                "lateness_s": None if run["lateness_s"] is None else round(run["lateness_s"], 3),
                "dispatch_lag_s": None if run["dispatch_lag_s"] is None else round(run["dispatch_lag_s"], 3),
            }
            for run in described["recent_runs"]
        ]
        for row in rows:
            row["state"] = _state_text(row)
        columns = ["run_id", "nominal_time", "state", "attempt", "lateness_s", "dispatch_lag_s", "origin"]
        _table(rows, [*columns, "last_error"])
    else:
        click.echo("  none")
    counters = described["counters"]
    runs_text = ", ".join(f"{state} {count}" for state, count in counters["runs"].items())
    click.echo(f"runs: {runs_text}; in flight {counters['in_flight']}")
    skips = counters["skips"]
    click.echo(
        "skipped: "
        + (
            ", ".join(
                f"{reason} {row['slots']} slots in {row['ranges']} ranges"
                + (f" ({row['uncounted']} ranges too long to count)" if row["uncounted"] else "")
                for reason, row in skips.items()
            )
            or "none"
        )
    )


@jobs.command("pause")
@dsn_option
@click.argument("job_id")
def jobs_pause(dsn: str, job_id: str) -> None:
    """Pause a job: no slot fires while it is paused (they are not caught up)."""
    from scheduler import jobs as jobsmod

    with open_store(dsn) as conn:
        jobsmod.set_paused(conn, _job_id(job_id), True)
    click.echo(f"paused {job_id}")


@jobs.command("resume")
@dsn_option
@click.argument("job_id")
@option(
    "--catch-up",
    type=Choice(["none", "backfill"]),
    default="none",
    show_default=True,
    help="The slots that passed while paused: none (they never run) or backfill (a run each, "
    "origin backfill, as jobs backfill makes them).",
)
@option(
    "--max-runs",
    default=1000,
    show_default=True,
    type=WholeNumber("max_runs", 1, 100_000),
    help="With --catch-up backfill: refuse (resuming nothing) if more slots passed than this.",
)
def jobs_resume(dsn: str, job_id: str, catch_up: str, max_runs: int) -> None:
    """Resume a paused job from its next slot after now (and, with --catch-up backfill,
    a run for each slot it missed while paused; one transaction)."""
    from scheduler.delivery import manual

    with open_store(dsn) as conn:
        result = manual.resume(conn, _job_id(job_id), catch_up=catch_up, max_runs=max_runs)
    click.echo(f"resumed {job_id}" + ("" if result is None else f"; backfilled {len(result.created)} runs"))


@jobs.command("delete")
@dsn_option
@click.argument("job_id", required=False)
@option("--tenant", default=None, help="With --all or --name-prefix: whose jobs.")
@option("--all", "all_jobs", is_flag=True, help="Delete every live job of --tenant.")
@option(
    "--name-prefix",
    default=None,
    help="Delete the live jobs of --tenant whose name starts with this (taken literally).",
)
@option("--yes", is_flag=True, help="Confirm a bulk delete without being asked.")
def jobs_delete(
    dsn: str, job_id: str | None, tenant: str | None, all_jobs: bool, name_prefix: str | None, yes: bool
) -> None:
    """Delete a job, or in bulk; deleted jobs stop firing at once, their runs stay.

    Exactly one of JOB_ID, --all or --name-prefix (the last two with
    --tenant). A bulk delete asks for confirmation on a terminal, or needs
    --yes (without a terminal and without --yes it exits 2, deleting
    nothing); it prints how many jobs it deleted.

    \b
    Example: scheduler jobs delete --tenant acme --name-prefix import: --yes
    """
    from scheduler import jobs as jobsmod

    if (job_id is not None) + all_jobs + (name_prefix is not None) != 1:
        raise ValidationError("delete", "give exactly one of JOB_ID, --all or --name-prefix")
    if job_id is not None:
        if tenant is not None:
            raise ValidationError("tenant", "applies to --all and --name-prefix only")
        with open_store(dsn) as conn:
            jobsmod.delete_job(conn, _job_id(job_id))
        click.echo(f"deleted {job_id}")
        return
    if tenant is None:
        raise ValidationError("tenant", "--all and --name-prefix need --tenant")

    def what(n: int) -> str:
        return f"job{'' if n == 1 else 's'} of tenant {tenant}" + (
            "" if name_prefix is None else f" named {name_prefix}*"
        )

    with open_store(dsn) as conn:
        count = jobsmod.count_jobs(conn, tenant, name_prefix=name_prefix)
        if count:
            _confirm(
                f"Delete {count} {what(count)}?",
                yes,
                refusal=f"deleting {count} {what(count)} needs confirmation; pass --yes (no terminal to ask on)",
                declined="not confirmed; nothing deleted",
            )
        deleted = jobsmod.delete_jobs(conn, tenant, name_prefix=name_prefix) if count else 0
    click.echo(f"deleted {deleted} {what(deleted)}")


@jobs.command("replan-slots")
@dsn_option
@option("--dry-run", is_flag=True, help="Count the slots that would move; change nothing.")
@option("--force", is_flag=True, help="Check every cron job even if the store already records this tzdata release.")
@json_option
def jobs_replan_slots(dsn: str, dry_run: bool, force: bool, as_json: bool) -> None:
    """Replan stored cron slots computed under another tzdata release.

    A zone's rules change between tzdata releases; a stored slot computed
    under the old rules can be an hour off. This walks every cron job with a
    pending slot and moves each whose slot is no slot under this host's
    bundled tzdata to its true slot (a compare-and-set; a concurrent edit or
    firing wins), then records the release in the store. Nodes do the same
    by themselves at start when the recorded release differs, and never fire
    a wrong slot meanwhile (docs/operations.md, "Time-zone database updates").
    """
    from scheduler import tzreplan

    with open_store(dsn) as conn:
        report = tzreplan.replan_store(conn, force=force, dry_run=dry_run)
    if as_json:
        _echo_json(dataclasses.asdict(report) | {"dry_run": dry_run})
        return
    if report.previous == report.current and not force:
        click.echo(f"slots already computed with tzdata {report.current}: nothing to do (--force checks anyway)")
        return
    verb = "would move" if dry_run else "moved"
    click.echo(
        f"checked {report.checked} cron jobs; {verb} {report.replanned} to their true slot "
        f"(tzdata {report.previous or 'unrecorded'} -> {report.current})"
    )


@jobs.command("trigger")
@dsn_option
@click.argument("job_id")
@option(
    "--request-id",
    default=None,
    help="Deduplicates: the same id again makes no second run (1-200 printable characters; default: a new UUID).",
)
@option(
    "--force",
    is_flag=True,
    help="Deliver the run at once even if the job's overlap policy would skip it (forbid) or hold it "
    "(buffer_one); replace still cancels the job's unfinished runs. The request id still deduplicates: "
    "a repeated --request-id makes no second run, forced or not.",
)
@option(
    "--wait-s",
    default=10.0,
    show_default=True,
    type=Decimal("wait_s", "must be a number of seconds from 0 to 86400 in ASCII digits", 0, 86_400),
    help="How long to wait for the partition owner to carry the request out.",
)
@json_option
def jobs_trigger(dsn: str, job_id: str, request_id: str | None, force: bool, wait_s: float, as_json: bool) -> None:
    """Run a job now, once (a manual run; docs/delivery.md, "Run now and backfill").

    The request is stored and carried out by the node that owns the job's
    partition, within about a second: a run with nominal time = the store's
    now, under the job's overlap policy ("skipped" if forbid finds an
    unfinished run; buffer_one holds it) unless --force. A paused job may be
    triggered; a deleted one is not found. Prints the run id, or "queued" if
    no node carried the request out within --wait-s (it stays queued until
    one does).
    """
    from scheduler.delivery import manual

    with open_store(dsn) as conn:
        request = manual.request_run(conn, _job_id(job_id), request_id, force=force)
        done = manual.wait_request(conn, request, wait_s)
    if as_json:
        _echo_json(dataclasses.asdict(done) | {"run_id": done.run_id})
        return
    if request_id is None:
        click.echo(f"request {done.request_id}")
    elif not done.created:
        click.echo(f"request {done.request_id} was made before: its outcome")
    if done.outcome == "fired":
        click.echo(f"fired run {done.run_id}")
    elif done.outcome == "skipped":
        click.echo(
            "skipped: the job's overlap policy forbids another run now (a new --request-id with --force runs it anyway)"
        )
    elif done.outcome == "deleted":
        raise NotFoundError(f"job_id: job {job_id} was deleted before its run")
    else:
        click.echo(f"queued: no node carried it out within {wait_s:g}s (it runs when the job's partition owner does)")


@jobs.command("backfill")
@dsn_option
@click.argument("job_id")
@option("--since", required=True, callback=instant("since"), help="ISO-8601 instant with offset (inclusive).")
@option(
    "--until",
    required=True,
    callback=instant("until"),
    help="ISO-8601 instant with offset (exclusive), not in the future.",
)
@option("--dry-run", is_flag=True, help="List the runs it would create; write nothing.")
@option(
    "--max-runs",
    default=1000,
    show_default=True,
    type=WholeNumber("max_runs", 1, 100_000),
    help="Refuse a range holding more slots than this.",
)
@json_option
def jobs_backfill(
    dsn: str, job_id: str, since: datetime, until: datetime, dry_run: bool, max_runs: int, as_json: bool
) -> None:
    """Create a run for each slot of a job's schedule in [--since, --until) that has none.

    The runs (origin backfill) are delivered like any other, outside the
    overlap policy; slots that have a run (fired, or backfilled before) keep
    it, so a repeated backfill creates nothing. One transaction; a range
    holding more than --max-runs slots is refused, nothing written.
    """
    from scheduler.delivery import manual
    from scheduler.delivery.lifecycle import RunKey
    from scheduler.schedule import format_instant

    jid = _job_id(job_id)
    with open_store(dsn) as conn:
        result = manual.backfill(conn, jid, since, until, max_runs=max_runs, dry_run=dry_run)
    created = [RunKey.of(jid, t).run_id for t in result.created]
    if as_json:
        _echo_json({"slots": len(result.slots), "created": created, "dry_run": dry_run})
        return
    for nominal, run_id in zip(result.created, created, strict=True):
        click.echo(f"{format_instant(nominal)}  {run_id}")
    verb = "would create" if dry_run else "created"
    click.echo(f"{len(result.slots)} slots in the range; {verb} {len(created)} runs", err=True)


def _utc_now() -> datetime:
    """This machine's clock now, aware UTC (``jobs next``'s default ``--after``)."""
    return datetime.now(UTC)


@jobs.command("next")
@_schedule_options
@option(
    "--after",
    default=None,
    callback=instant("after"),
    help="ISO-8601 instant with offset; fires strictly after it are listed "
    "(default: now, this machine's clock, as GET /v1/explain).",
)
@option("--count", default=5, show_default=True, type=WholeNumber("count", 1, 10_000))
def jobs_next(cron: str | None, tz: str | None, dialect: str | None, after: datetime | None, count: int) -> None:
    """Print the next COUNT fire instants of a cron expression (UTC, one per line).

    Needs no store; without --after, the fires after now. Example: scheduler jobs next --cron '0 2 * * *'
    --tz Europe/Berlin --after 2023-10-27T12:00:00+02:00

    \b
    Friday the 13th (Spring's AND day rule of the seconds dialect):
    scheduler jobs next --cron '0 0 0 13 * FRI' --dialect seconds --after 2024-01-01T00:00:00Z
    """
    from scheduler.schedule import CronSchedule, format_instant
    from scheduler.spec import check_cron_text

    if cron is None:
        raise ValidationError("cron", "is required (--cron EXPR)")
    check_cron_text(cron)
    schedule = CronSchedule(cron, "UTC" if tz is None else tz, dialect or "unix")
    instant_ = _utc_now() if after is None else after
    for listed in range(count):
        instant_ = schedule.next_after(instant_)
        if instant_ is None:
            click.echo(
                f"no {'' if listed == 0 else 'further '}fire before the end of the supported range (year 9997)",
                err=True,
            )
            break
        click.echo(format_instant(instant_))


# ---------------------------------------------------------------- runs


@cli.group(cls=OneLineErrors)
def runs() -> None:
    """List, cancel, redrive and prune runs (one per fired job and nominal time)."""


@runs.command("list")
@dsn_option
@option("--job", "job_id", default=None, help="Only this job's runs (an unknown job exits 2).")
@option("--since", default=None, callback=instant("since"), help="Nominal time at or after (ISO-8601).")
@option(
    "--until",
    default=None,
    callback=instant("until"),
    help="Nominal time before (ISO-8601, exclusive; later than --since).",
)
@option(
    "--state",
    type=Choice(RUN_STATES),
    default=None,
    help="Only runs in this delivery state (runs fired before delivery existed have none).",
)
@option("--tenant", default=None, help="Only this tenant's runs (an unknown tenant exits 2).")
@limit_option(100, "At most this many runs, newest nominal time first")
@json_option
def runs_list(
    dsn: str,
    job_id: str | None,
    since: datetime | None,
    until: datetime | None,
    state: str | None,
    tenant: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List runs, newest nominal time first: run id, job name, delivery state, attempts, worker, last error.

    JOB_NAME is the job's name when the run was created (- for a job without one).

    WORKER is who made the last claim: `api:<key id>[:<label>]` for an HTTP worker,
    `<host>:<pid>` for `scheduler worker`, the node id for a push (- never claimed).

    A run id is <job id>.<nominal time in Unix microseconds> (`runs redrive` takes it).
    """
    from scheduler import jobs as jobsmod
    from scheduler.delivery.views import run_id

    with open_store(dsn) as conn:
        rows = jobsmod.list_runs(
            conn, _job_id(job_id) if job_id else None, since, limit, state=state, tenant=tenant, until=until
        )
    rows = [{"run_id": run_id(row["job_id"], row["nominal_time"]), **row} for row in rows]
    if as_json:
        _echo_json(rows)
    else:
        for row in rows:  # one line each: the error's whitespace collapsed, cut to 80 characters (… if cut)
            if row["last_error"] is not None:
                row["last_error"] = logmod.cut(" ".join(row["last_error"].split()), ECHO_MAX_CHARS)
            row["state"] = _state_text(row)
        columns = ["run_id", "tenant", "job_name", "nominal_time", "state", "attempt", "fired_at", "lateness_s"]
        _table(rows, [*columns, "worker", "last_error"])


@runs.command("redrive")
@dsn_option
@click.argument("run_id", required=False)
@option("--job", "job_id", default=None, help="Redrive this job's runs in --state (instead of RUN_ID).")
@option(
    "--state",
    type=Choice(["dead", "canceled"]),
    default=None,
    help="With --job: the state of the runs to redrive.",
)
@limit_option(100, "With --job: at most this many, oldest first")
@json_option
def runs_redrive(
    dsn: str, run_id: str | None, job_id: str | None, state: str | None, limit: int, as_json: bool
) -> None:
    """Move a dead or canceled run (RUN_ID), or a job's (--job J --state dead), back to pending.

    The run is available at once, with a fresh retry budget: attempt reset
    to 0 and the first claim forgotten (max_attempts and max_age_s count
    from the redrive); last_error is kept until an attempt succeeds. A
    RUN_ID that is not dead or canceled exits 2 naming its state, changing
    nothing; so does a run of a deleted job (it would be delivered again to
    a target nothing expects any more), and so does --job of a deleted job.
    Prints the run ids redriven, one a line.
    """
    from scheduler.delivery import views

    if (run_id is None) == (job_id is None):
        raise ValidationError("redrive", "give exactly one of RUN_ID or --job")
    if run_id is not None and state is not None:
        raise ValidationError("state", "applies to --job only (RUN_ID names one run)")
    if job_id is not None and state is None:
        raise ValidationError("state", "--job needs --state dead or --state canceled")
    with open_store(dsn) as conn:
        if run_id is not None:
            done = [views.redrive(conn, run_id)]
        else:
            done = views.redrive_job(conn, _job_id(job_id), state, limit)
    if as_json:
        _echo_json({"redriven": done})
        return
    for line in done:
        click.echo(line)
    click.echo(f"redrove {len(done)} run{'' if len(done) == 1 else 's'}", err=True)


@runs.command("cancel")
@dsn_option
@click.argument("run_id")
def runs_cancel(dsn: str, run_id: str) -> None:
    """Cancel an unfinished (pending, leased or failed) run: it ends canceled now.

    A pending run is then never claimed or pushed; a leased one's worker hears
    "canceled" at its next heartbeat (an async handler is cancelled; a sync
    one should check run.abandoned) and its ack is refused, as after overlap
    replace. last_error says "canceled by scheduler runs cancel". A finished
    run (succeeded, dead, canceled) exits 2 naming its state, changing
    nothing. `runs redrive` brings a canceled run back. Prints the run id.
    """
    from scheduler.delivery import views

    with open_store(dsn) as conn:
        done = views.cancel(conn, run_id)
    click.echo(done)
    click.echo("canceled 1 run", err=True)


@runs.command("prune")
@dsn_option
@option(
    "--older-than",
    "older_than",
    required=True,
    help="Age: 7d, 12h, 30m, 45s, 1d12h or plain seconds. Deletes finished runs whose nominal time is "
    "older (never a pending, leased or failed one), skip ranges that ended before, and jobs deleted "
    "before now minus this.",
)
@option(
    "--batch-rows",
    default=settings_mod.RETENTION_BATCH_ROWS,
    show_default=True,
    type=WholeNumber("batch_rows", 1, 100_000),
    help="Rows per DELETE (each its own transaction).",
)
@json_option
def runs_prune(dsn: str, older_than: str, batch_rows: int, as_json: bool) -> None:
    """Delete old runs, skips and soft-deleted jobs in bounded batches; print the counts.

    The cutoff is the store's now minus --older-than. Safe while nodes run
    and safe to interrupt (committed batches stay deleted; re-run resumes).
    A later `verify` of a pruned window reports its runs as missing.
    """
    from scheduler.retention import parse_duration, prune

    seconds = parse_duration(older_than)
    with open_store(dsn) as conn:
        report = prune(conn, seconds, batch_rows=batch_rows)
    if as_json:
        _echo_json(report.as_dict())
    else:
        click.echo(
            f"pruned {report.runs} runs, {report.skips} skips, {report.jobs} deleted jobs "
            f"older than {_fmt(report.cutoff)} in {report.batches} batches"
        )


# ---------------------------------------------------------------- node


SETTING_HELP = {
    "dsn": DSN_HELP,
    "node_id": "Node identity [default: hostname + random suffix].",
    "lease_ttl_s": "Lease time-to-live.",
    "renew_interval_s": "Heartbeat and lease renewal period.",
    "poll_interval_s": "Membership poll / claim period.",
    "tick_interval_s": "Firing tick period.",
    "safety_margin_s": "Stop firing this long before the local lease deadline (>= 0.5).",
    "max_rate_per_s": "Firing budget of this node in runs/s (pacing).",
    "node_prune_after_s": "Delete heartbeat rows of nodes dead this long.",
    "lock_timeout_s": "Store lock_timeout [default: 20% of the TTL].",
    "statement_timeout_s": "Store statement_timeout [default: 40% of the TTL].",
    "idle_in_transaction_timeout_s": "Store idle_in_transaction_session_timeout [default: 40% of the TTL].",
    "metrics_host": "Interface of /metrics, /healthz, /readyz (0.0.0.0 inside a container).",
    "metrics_port": "Serve /metrics, /healthz and /readyz on this port (0: any free port) [default: off].",
    "log_format": "Log record format (stderr); also a global option.",
    "log_level": "Log level; also a global option.",
    "retention_s": "Delete runs, skips and deleted jobs older than this many seconds [default: off].",
    "retention_batch_rows": "Rows per retention DELETE batch.",
    "retention_batch_interval_s": "At most one retention batch per this many seconds.",
    "tcp_user_timeout_s": "TCP user timeout of node sessions (unacknowledged data this long drops the "
    "connection; keepalives derive from the TTL) [default: 50% of the TTL].",
    "store_call_margin_s": "Watchdog: cancel a store call the store has been silent in past statement_timeout "
    "+ this, break its connection past + 2x this [default: 20% of the TTL, at least 0.5].",
    "loop_stall_s": "/healthz fails when the lease or firing loop made no progress this long "
    "[default: the TTL, or 2 ticks if longer].",
    "stop_timeout_s": "After SIGTERM/SIGINT, exit within this (gracefully, else with status 1).",
    "coordinator": "Who decides partition ownership: 'sql' (lease rows in the store) or 'etcd' "
    "(etcd leases and a watch; needs the etcd extra).",
    "etcd_endpoints": "etcd client endpoints host:port[,host:port] (coordinator etcd).",
    "etcd_prefix": "Key prefix of this fleet's keys in etcd (coordinator etcd).",
    "push_allow": "Networks push targets may reach beyond the public internet, comma-separated "
    "(e.g. 10.0.0.0/8,127.0.0.1/32); loopback, private, link-local and metadata addresses are refused "
    "otherwise.",
    "push_concurrency": "Push attempts this node runs at once.",
    "push_per_host": "Push attempts this node runs at once against one target host.",
    "api_host": "Interface of the tenant HTTP API (0.0.0.0 only behind a TLS proxy; docs/api.md).",
    "api_port": "Serve the tenant HTTP API on this port, on its own thread (0: any free port) [default: off].",
    "api_rate_per_s": "HTTP API: requests per second each key may send (token bucket; 429 beyond).",
    "api_burst": "HTTP API: requests a key may send at once after being idle (token bucket size).",
    "api_pool_size": "HTTP API: store connections held at most (requests served at once).",
    "api_auth_fail_rate_per_s": "HTTP API: failed authentications (401s) per second one client address may "
    "keep making (token bucket; 429 beyond, even with a valid key).",
    "api_auth_fail_burst": "HTTP API: failed authentications one client address may make at once.",
    "api_forwarded_allow_ips": "HTTP API: proxies (comma-separated IPs or networks, or *) whose "
    "X-Forwarded-For/-Proto name the client [default: none, the socket peer is the client].",
}
"""Help text of each Settings field's option (every field has one; a test checks)."""

_CHOICES = {
    "log_format": settings_mod.LOG_FORMATS,
    "log_level": settings_mod.LOG_LEVELS,
    "coordinator": settings_mod.COORDINATORS,
}


def _settings_options(func: Callable, only: tuple[str, ...] | None = None) -> Callable:
    """One option per Settings field (--lease-ttl-s / SCHEDULER_LEASE_TTL_S, ...) plus --config;
    ``only``: just those fields.

    Options default to None, so :func:`_resolve_settings` can tell a flag or
    an environment variable (click's parameter source) from a value to take
    from the config file or the Settings default.
    """
    types = settings_mod.field_types()
    defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
    for name in reversed([name for name in types if only is None or name in only]):
        kind = types[name]
        param_type: Any = (
            Choice(_CHOICES[name])
            if name in _CHOICES
            else {float: Decimal(name), int: WholeNumber(name), str: click.STRING}[kind]
        )
        default = defaults[name]
        shown = default not in ("", None)
        func = option(
            f"--{name.replace('_', '-')}",
            name,
            type=param_type,
            default=None,
            envvar=f"SCHEDULER_{name.upper()}",
            show_envvar=True,
            help=SETTING_HELP.get(name, "") + (f"  [default: {default}]" if shown else ""),
            callback=_register_dsn if name == "dsn" else None,
        )(func)
    return option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        envvar="SCHEDULER_CONFIG",
        show_envvar=True,
        help="TOML file of settings (keys: the setting names, e.g. lease_ttl_s = 10). "
        "Precedence: flag > env > file > default.",
    )(func)


def _resolve_settings(ctx: click.Context, values: dict[str, Any]) -> tuple[Settings, dict[str, str]]:
    """The effective settings and each one's source (flag/env/file/default); not
    validated (:func:`_checked` does, naming where a refused value came from)."""
    flags: dict[str, Any] = dict((ctx.obj or {}).get("root_flags", {}))
    env: dict[str, Any] = {}
    for name, value in values.items():
        if name == "config_path" or value is None:
            continue
        source = ctx.get_parameter_source(name)
        if source is click.core.ParameterSource.ENVIRONMENT:
            env[name] = value
        else:
            flags[name] = value
    config_path = values.get("config_path")
    file_values = settings_mod.load_file(config_path) if config_path is not None else {}
    settings, sources = settings_mod.resolve(flags, env, file_values)
    _register_dsn(None, None, settings.dsn)
    ctx.meta["scheduler.settings_origin"] = (sources, config_path)
    return settings, sources


def _origin(name: str, source: str, config_path: Path | None) -> str | None:
    """Where setting ``name``'s value came from, as an error about it says it:
    its environment variable (``SCHEDULER_LEASE_TTL_S``) or ``lease_ttl_s in
    <config file>``; None for a flag or the default (the field's own name
    says it)."""
    if source == "env":
        return f"SCHEDULER_{name.upper()}"
    if source == "file" and config_path is not None:
        return f"{name} in {config_path}"
    return None


_SETTING_NAME = re.compile(r"\b(" + "|".join(sorted(settings_mod.field_types(), key=len, reverse=True)) + r")\b")


def _checked(ctx: click.Context, settings: Settings, *, validate: bool = False) -> Settings:
    """``settings.check()`` (``validated()`` if ``validate``); its ConfigError's
    message, which names every setting involved, ends with where each of
    them that came from the environment or the config file was set: ``lease_ttl_s
    must be a finite number > 0 (got 0.0); set by SCHEDULER_LEASE_TTL_S``. A
    systemd unit's or a container's variables are not on the command line
    the operator reads.

    Raises ConfigError (exit status 2).
    """
    try:
        if validate:
            return settings.validated()
        settings.check()
        return settings
    except ConfigError as exc:
        sources, config_path = ctx.meta.get("scheduler.settings_origin", ({}, None))
        where = [_origin(name, sources.get(name, "default"), config_path) for name in _SETTING_NAME.findall(str(exc))]
        raise ConfigError(_set_by(str(exc), where)) from None


@cli.command("node")
@_settings_options
@click.pass_context
def node_cmd(ctx: click.Context, **values: Any) -> None:
    """Run a scheduler node until SIGTERM/SIGINT (then release leases, exit 0).

    With --metrics-port, serves /metrics (Prometheus), /healthz and /readyz.
    """
    from scheduler.node import Node

    settings, _ = _resolve_settings(ctx, values)
    if not settings.dsn:
        raise ConfigError(f"dsn: no store configured; pass --dsn or set SCHEDULER_DSN (e.g. {DSN_HINT})")
    settings = _checked(ctx, settings, validate=True)
    logmod.configure(settings.log_format, settings.log_level)
    Node(settings).run_until_signalled()


# ---------------------------------------------------------------- api

API_PORT = 8080
"""``scheduler api``'s port unless --port / SCHEDULER_API_PORT says otherwise."""


@cli.command("api")
@option(
    "--host",
    envvar="SCHEDULER_API_HOST",
    show_envvar=True,
    default=None,
    help="Interface to listen on  [default: 127.0.0.1, loopback]. Bind 0.0.0.0 only behind a TLS proxy "
    "or with --ssl-certfile.",
)
@option(
    "--port",
    envvar="SCHEDULER_API_PORT",
    show_envvar=True,
    default=None,
    type=WholeNumber("port", 0, 65535),
    help=f"TCP port (0: any free port)  [default: {API_PORT}].",
)
@option(
    "--ssl-certfile",
    type=ExistingFile(str),
    default=None,
    help="Serve HTTPS with this PEM certificate (uvicorn's TLS; with --ssl-keyfile).",
)
@option(
    "--ssl-keyfile",
    type=ExistingFile(str),
    default=None,
    help="The certificate's PEM private key.",
)
@option(
    "--access-log",
    is_flag=True,
    help="Log every request as event api_request (method, path without the query, status, duration_ms, client; "
    "never headers).",
)
@functools.partial(
    _settings_options,
    only=(
        "dsn",
        "api_rate_per_s",
        "api_burst",
        "api_pool_size",
        "api_auth_fail_rate_per_s",
        "api_auth_fail_burst",
        "api_forwarded_allow_ips",
        "push_allow",
        "log_format",
        "log_level",
    ),
)
@click.pass_context
def api_cmd(
    ctx: click.Context,
    host: str | None,
    port: int | None,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
    access_log: bool,
    **values: Any,
) -> None:
    """Serve the tenant HTTP API (docs/api.md) until SIGTERM/SIGINT.

    Loopback (127.0.0.1:8080) by default. Clients authenticate with
    `Authorization: Bearer <token>` (scheduler keys create). The schema is
    at /openapi.json.

    \b
    TLS: either --ssl-certfile/--ssl-keyfile (uvicorn terminates TLS), or
    keep the loopback default behind a reverse proxy that does (nginx,
    Caddy, a cloud load balancer). Never expose plain HTTP: keys travel in
    a header.
    """
    from scheduler.api.server import serve

    if (ssl_certfile is None) != (ssl_keyfile is None):
        raise click.UsageError("--ssl-certfile and --ssl-keyfile go together: give both or neither")
    settings, _ = _resolve_settings(ctx, values)
    settings = dataclasses.replace(
        settings,
        api_host=host if host is not None else settings.api_host,
        api_port=port if port is not None else API_PORT,
    )
    _checked(ctx, settings)
    logmod.configure(settings.log_format, settings.log_level)
    open_store(settings.dsn).close()  # misconfigured (no DSN, bad password, schema behind): exit 2 now
    try:
        serve(
            settings.dsn,
            settings.api_host,
            settings.api_port,
            settings=settings.api,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            access_log=access_log,
        )
    except OSError as exc:
        raise ConfigError(
            f"port: cannot listen on {settings.api_host}:{settings.api_port} ({exc.strerror or exc})"
        ) from None


# ---------------------------------------------------------------- worker


@cli.command("worker")
@dsn_option
@option(
    "--tenant",
    "tenants",
    multiple=True,
    envvar="SCHEDULER_TENANT",
    show_envvar=True,
    help="Tenant whose queue to serve (required with --dsn); repeat it to serve several from one process, "
    "claimed in turn from those the store reports runs for (the variable: names separated by spaces). "
    "Not with --api-url: the key's tenant.",
)
@option(
    "--api-url",
    default=None,
    envvar="SCHEDULER_API_URL",
    show_envvar=True,
    help="Claim, heartbeat, ack and nack through the HTTP API at this URL instead of the store (no database "
    "credentials; SCHEDULER_DSN and SCHEDULER_TENANT are then ignored); the key (a worker or tenant key) is read "
    "from the environment variable SCHEDULER_API_KEY, never from the command line.",
)
@option("--queue", default="default", show_default=True, help="Queue (of each tenant) to serve.")
@option(
    "--handler",
    "handler_path",
    required=True,
    help="package.module:function called with each run (sync or async def); the current directory is importable.",
)
@option(
    "--concurrency", default=10, show_default=True, type=WholeNumber("concurrency", 1, 10_000), help="Handlers at once."
)
@option(
    "--lease-s",
    default=30.0,
    show_default=True,
    type=Decimal("lease_s", "must be a number of seconds from 1 to 3600 in ASCII digits", 1, 3600),
    help="Lease of each attempt; heartbeats extend it every third of it.",
)
@option(
    "--batch",
    default=None,
    type=WholeNumber("batch", 1, 1000),
    help="Most runs per claim and per ack/nack statement  [default: concurrency, at least 100, at most 1000].",
)
@option(
    "--stop-timeout-s",
    default=25.0,
    show_default=True,
    type=Decimal("stop_timeout_s", "must be a number of seconds from 0 to 86400 in ASCII digits", 0, 86_400),
    help="After SIGTERM/SIGINT, in-flight handlers get this long; runs still running then are nacked.",
)
@option("--worker-id", default=None, help="Written to runs.worker  [default: hostname:pid].")
@option("--metrics-host", default="127.0.0.1", show_default=True, help="Interface of /metrics.")
@option(
    "--metrics-port",
    default=None,
    type=WholeNumber("metrics_port", 0, 65535),
    help="Serve /metrics, /healthz and /readyz on this port (0: any free port)  [default: off].",
)
def worker_cmd(
    dsn: str,
    tenants: tuple[str, ...],
    api_url: str | None,
    queue: str,
    handler_path: str,
    concurrency: int,
    lease_s: float,
    batch: int | None,
    stop_timeout_s: float,
    worker_id: str | None,
    metrics_host: str,
    metrics_port: int | None,
) -> None:
    """Run a pull worker: claim runs of a tenant's queue, call the handler with each, ack or nack.

    The handler (sync or async) is called with one argument, a
    scheduler.delivery.worker.Run with these attributes:

    \b
      run_id (str): <job_id>.<nominal time in Unix µs>, the same on every attempt
      job_id (uuid.UUID)
      job_name (str | None): the job's name, None if it has none
      tenant (str), queue (str)
      nominal_time (datetime, UTC): the fire time the schedule gave
      scheduled_at (datetime, UTC): nominal_time plus the job's jitter
      attempt (int): counts from 1
      payload: the job's JSON payload decoded (None if it has none)
      origin (str): schedule, manual or backfill
      abandoned: set when the worker gives the attempt up (a sync handler may poll it)

    Returning acks the run; raising nacks it (retried after a backoff, or
    dead when attempts run out; raise scheduler.delivery.worker.DoNotRetry to
    make it dead at once). On SIGTERM/SIGINT: stop claiming, let in-flight
    handlers finish within --stop-timeout-s, nack the rest, exit 0.

    With --api-url the worker talks to the HTTP API (docs/api.md, "Runs and
    workers") with the key in SCHEDULER_API_KEY, and needs no --dsn.
    """
    from scheduler.delivery.api_client import API_KEY_ENV, validate_api_url
    from scheduler.delivery.worker import Worker, load_handler
    from scheduler.health import HealthServer

    api_key = None
    if api_url is not None:
        # Given on the command line they contradict --api-url; from the environment
        # (SCHEDULER_DSN, SCHEDULER_TENANT of a shared profile) they are ignored.
        ctx = click.get_current_context()
        typed = click.core.ParameterSource.COMMANDLINE
        if dsn and ctx.get_parameter_source("dsn") == typed:
            raise ValidationError("api_url", "give either --dsn or --api-url, not both")
        if tenants and ctx.get_parameter_source("tenants") == typed:
            raise ValidationError("tenant", "not with --api-url: the worker serves the key's tenant")
        api_key = os.environ.get(API_KEY_ENV, "").strip()
        if not api_key:
            raise ConfigError(f"api_key: --api-url needs the key in the environment variable {API_KEY_ENV}")
        logmod.add_secret(api_key)
        validate_api_url(api_url)  # before the handler's import: user code, which may fail too
    elif not tenants:
        raise ValidationError("tenant", "give --tenant (or SCHEDULER_TENANT), or --api-url")
    handler = load_handler(handler_path)
    worker = Worker(
        None if api_url is not None else dsn,
        None if api_url is not None else tenants,
        queue,
        handler,
        concurrency=concurrency,
        lease_s=lease_s,
        batch=batch,
        stop_timeout_s=stop_timeout_s,
        worker_id=worker_id,
        api_url=api_url,
        api_key=api_key,
    )
    if api_url is not None:
        _check_api_key(api_url, api_key or "")
    else:
        try:
            open_store(dsn).close()  # misconfigured (bad DSN, password, database, schema): exit 2 now
        except StoreError as exc:  # merely unreachable: the worker retries, as a node does
            logmod.event("worker_store_unreachable", logging.WARNING, error=str(exc))
    health = None
    if metrics_port is not None:

        def readiness() -> tuple[bool, list[str], dict]:
            reasons = ["stopping: the worker is draining after a stop signal"] if worker.stopping else []
            return not reasons, reasons, {}

        health = HealthServer(metrics_host, metrics_port, worker.metrics, readiness)  # type: ignore[arg-type]
        health.start()
    try:
        worker.run_until_signalled()
    finally:
        if health is not None:
            health.stop()


def _check_api_key(api_url: str, api_key: str) -> None:
    """A worker's start over the API: exit 2 (ConfigError) if the API refuses the key (401/403)
    or the request (another 4xx); merely unreachable or failing (5xx, 429): a warning, the worker retries."""
    import asyncio

    from scheduler.delivery.api_client import API_KEY_ENV, ApiRefused, ApiTransport, ApiUnavailable

    async def probe() -> None:
        transport = ApiTransport(api_url, api_key, timeout_s=5.0)
        try:
            await transport.check()
        finally:
            await transport.close()

    try:
        asyncio.run(probe())
    except ApiUnavailable as exc:
        if exc.status in (401, 403):
            raise ConfigError(f"api_key: the API at {api_url} refused the key in {API_KEY_ENV} ({exc})") from None
        logmod.event("worker_api_unreachable", logging.WARNING, error=str(exc))
    except ApiRefused as exc:
        raise ConfigError(f"api_url: the API at {api_url} refused the worker's request ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - unreachable (refused, timed out): the worker retries
        logmod.event("worker_api_unreachable", logging.WARNING, error=f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------- config


@cli.group(cls=OneLineErrors)
def config() -> None:
    """Inspect the node's effective settings."""


@config.command("show")
@_settings_options
@json_option
@click.pass_context
def config_show(ctx: click.Context, as_json: bool, **values: Any) -> None:
    """Print every node setting with its effective value and source (flag, env, file, default).

    Takes the same options, environment and --config file as `scheduler
    node`; the store password is masked. Exits 2 with a one-line error if
    the combination is invalid (as `scheduler node` would).
    """
    from scheduler.store import check_dsn, redact_dsn

    settings, sources = _resolve_settings(ctx, values)
    _checked(ctx, settings)
    check_dsn(settings.dsn)  # as a node's first connection would (never echoes the password)
    rows = []
    for field in dataclasses.fields(Settings):
        value = getattr(settings, field.name)
        if field.name == "dsn":
            value = redact_dsn(value)
        row = {"setting": field.name, "value": value, "source": sources[field.name]}
        derived = f"effective_{field.name}"
        if value is None and hasattr(settings, derived):  # store timeouts derived from the TTL
            row["effective"] = round(getattr(settings, derived), 6)
        rows.append(row)
    if as_json:
        _echo_json({row.pop("setting"): row for row in rows})
        return
    for row in rows:
        if "effective" in row:
            row["value"] = f"{row['effective']} (from lease_ttl_s)"
        elif row["value"] in ("", None):
            row["value"] = {"node_id": "(generated at start)", "dsn": "(not set)"}.get(row["setting"], "off")
    _table(rows, ["setting", "value", "source"])


# ---------------------------------------------------------------- audit / status


def _fleet_timing(name: str, help_text: str) -> Callable:
    """``--<name>``: one of the fleet's lease timings (seconds), defaulting to the node's setting."""
    return option(
        f"--{name.replace('_', '-')}",
        type=FleetSeconds(name),
        default=getattr(Settings, name),
        envvar=f"SCHEDULER_{name.upper()}",
        show_envvar=True,
        show_default=True,
        help=help_text,
    )


@cli.command("verify")
@dsn_option
@option("--since", required=True, callback=instant("since"), help="Window start (inclusive), ISO-8601.")
@option("--until", required=True, callback=instant("until"), help="Window end (exclusive), ISO-8601.")
@option(
    "--exhaustive",
    is_flag=True,
    help="Also recompute every expected slot with the independent brute-force oracle (slow).",
)
@option(
    "--list-limit",
    type=WholeNumber("list_limit", 0, 10_000),
    default=100,
    show_default=True,
    help="Findings of each kind --json lists (the text lists the first 10 of each; the counts are always totals).",
)
@option(
    "--delivery",
    is_flag=True,
    help="Also audit delivery: every run succeeded, dead, canceled or still being delivered; none lost.",
)
@_fleet_timing("lease_ttl_s", "With --delivery: the fleet's lease TTL (a lease ended TTL + 1 s ago is stale).")
@json_option
def verify_cmd(
    dsn: str,
    since: datetime,
    until: datetime,
    exhaustive: bool,
    list_limit: int,
    delivery: bool,
    lease_ttl_s: float,
    as_json: bool,
) -> None:
    """Check every (job, nominal time) in [SINCE, UNTIL) has exactly one run, on time.

    Exit status 1 if anything is missing, duplicated, early or unexpected, a
    skip breaks its rule, or (--exhaustive) the oracle disagrees with the
    expected slots. --json adds the findings: for each kind the first
    --list-limit (job, nominal time) pairs.

    --delivery also audits the window's runs by delivery state (JSON: key
    "delivery"): succeeded, dead, canceled, pending, leased, failed, lost (no
    delivery state though fired after delivery existed: exit status 1),
    predelivery, and stale (leased or failed runs whose lease ended more
    than the TTL + 1 s ago: reported, their owner should have settled them).
    Dead, canceled, lost and stale runs are listed.

    It checks the store it reads. After a failover to an asynchronous standby
    (or a restored backup) the runs of the lost window are gone and their
    slots fired again with the same run id: the store holds each once and
    verify reports the window clean, so a clean verify does not prove no slot
    reached the executors twice. The nodes' scheduler_store_rewind_detected_total
    notices such a rewind when the lost window held one of their lease
    renewals or claims, or, checked after they reconnect, the last run one of
    them committed in a partition (not runs of a node that died with the old
    primary); the executors' deduplication by run id absorbs it.
    """
    from scheduler.audit import verify, verify_delivery

    with open_store(dsn) as conn:
        # retried whole on 40001/40P01 by verify itself
        report = verify(conn, since, until, exhaustive=exhaustive, list_limit=list_limit)
        delivered = (
            verify_delivery(conn, since, until, lease_ttl_s=lease_ttl_s, list_limit=list_limit) if delivery else None
        )
    if as_json:
        _echo_json(report.as_dict() | ({"delivery": delivered.as_dict()} if delivered else {}))
    else:
        for key, value in report.as_dict().items():
            if key not in ("findings", "findings_limit"):
                click.echo(f"{key}: {_fmt(value if not isinstance(value, float) else round(value, 3))}")
        if report.failed:
            click.echo("FAILED: " + ", ".join(f"{count} {name}" for name, count in report.failed.items()))
            for name, count in report.failed.items():
                listed = report.findings.get(name, [])[:10]
                for row in listed:
                    instant = row.get("nominal_time") or row.get("first_nominal")
                    detail = " ".join(
                        f"{key}={value}"
                        for key, value in row.items()
                        if key not in ("job_id", "nominal_time", "first_nominal")
                    )
                    click.echo(f"  {name} {row['job_id']} {instant}" + (f" {detail}" if detail else ""))
                if count > len(listed):
                    click.echo(f"  ... {count - len(listed)} more {name} (--json lists up to --list-limit)")
        if delivered is not None:
            _echo_delivery_audit(delivered)
    if not report.ok or (delivered is not None and not delivered.ok):
        sys.exit(EXIT_FAILED)


def _echo_delivery_audit(report: Any) -> None:
    """The text form of a :class:`scheduler.audit.DeliveryReport` (after verify's own lines)."""
    from scheduler.audit import DELIVERY_FINDINGS

    for key, value in report.as_dict().items():
        if key not in ("findings", "findings_limit"):
            click.echo(f"delivery_{key}: {_fmt(value)}")
    if report.lost:
        click.echo(f"FAILED: {report.lost} lost (runs without a delivery state)")
    for kind in DELIVERY_FINDINGS:
        listed = report.findings.get(kind, [])[:10]
        for row in listed:
            detail = f"attempt={row['attempt']}" + (
                f" leased_until={row['leased_until']} worker={row['worker']}" if kind == "stale" else ""
            )
            if row["last_error"] is not None:
                detail += f" last_error={clip(row['last_error'])}"
            click.echo(f"  {kind} {row['run_id']} {detail}")
        count = getattr(report, kind)
        if count > len(listed):
            click.echo(f"  ... {count - len(listed)} more {kind} (--json lists up to --list-limit)")


@cli.command("status")
@dsn_option
@_fleet_timing("lease_ttl_s", "The fleet's lease TTL: a heartbeat older than this is dead.")
@_fleet_timing("renew_interval_s", "The fleet's renew interval (with --poll-interval-s: the responsiveness bound).")
@_fleet_timing("poll_interval_s", "The fleet's poll interval.")
@json_option
def status_cmd(dsn: str, lease_ttl_s: float, renew_interval_s: float, poll_interval_s: float, as_json: bool) -> None:
    """Show nodes (live, suspect, dead), the partitions they own, and partitions without a live owner.

    A node is suspect when its heartbeat is older than the responsiveness
    bound, min(TTL, renew + 2 x poll): peers no longer count it, but its
    leases hold until they expire.
    """
    from scheduler.settings import Settings
    from scheduler.status import cluster_status

    responsive_s = Settings(
        lease_ttl_s=lease_ttl_s, renew_interval_s=renew_interval_s, poll_interval_s=poll_interval_s
    ).responsive_s
    with open_store(dsn) as conn:
        status = cluster_status(conn, lease_ttl_s, responsive_s)
    if as_json:
        _echo_json(status)
        return
    rows = [
        {**node, "heartbeat": f"{node['heartbeat_age_s']:.1f}s of {lease_ttl_s:g}s TTL"} for node in status["nodes"]
    ]
    _table(rows, ["node_id", "state", "heartbeat", "partitions", "epochs", "lease_left_s"])
    suspect = status["partitions_owned_suspect"]
    click.echo(
        f"partitions: {status['partitions_total']} total, {status['partitions_owned_live']} owned by "
        f"live nodes"
        + (f" ({suspect} of them by suspect nodes)" if suspect else "")
        + f", {status['partitions_orphaned']} without a live owner"
    )
    if any(node["state"] == "suspect" for node in status["nodes"]):
        click.echo(
            f"suspect: no heartbeat for {responsive_s:g}s or more (renew + 2 polls): dead or frozen; "
            f"peers no longer count it, nobody fires its partitions until their leases expire "
            f"(LEASE_LEFT_S)"
        )
    for row in status["orphaned_sample"]:
        click.echo(
            f"  orphaned partition {row['partition_id']} owner={_fmt(row['owner_node'])} "
            f"epoch={row['owner_epoch']} lease_left_s={_fmt(row['lease_left_s'])}"
        )
    more = status["partitions_orphaned"] - len(status["orphaned_sample"])
    if more > 0:
        click.echo(f"  and {more} more orphaned partitions")


# ---------------------------------------------------------------- etcd


@cli.group(cls=OneLineErrors)
def etcd() -> None:
    """Operations on the etcd the etcd coordinator uses."""


@etcd.command("raise-revision")
@dsn_option
@option(
    "--etcd-endpoints",
    envvar="SCHEDULER_ETCD_ENDPOINTS",
    show_envvar=True,
    default="",
    help="etcd client endpoints host:port[,host:port] (the fleet's; the first that answers is used).",
)
@json_option
def etcd_raise_revision(dsn: str, etcd_endpoints: str, as_json: bool) -> None:
    """Raise etcd's revision above every owner_epoch in the store.

    Run it before starting nodes with --coordinator etcd on a store whose
    epochs came from the SQL coordinator, or from an etcd rebuilt from
    scratch: a node refuses to start while etcd's revision is below a stored
    epoch. Puts (then deletes) the key /scheduler-revision-bump until the
    revision is above the largest epoch; about a thousand puts a second.
    Safe to re-run. Exit status 2 on bad input, 1 if the store or every etcd
    endpoint fails.
    """
    from scheduler.coordination.etcd_gateway import raise_above_store
    from scheduler.coordination.etcd_keys import parse_endpoints

    endpoints = parse_endpoints(etcd_endpoints)  # ConfigError naming etcd_endpoints
    with open_store(dsn) as conn:
        done = raise_above_store(conn, endpoints)
    if as_json:
        _echo_json(dataclasses.asdict(done))
    elif done.before > done.top_epoch:
        click.echo(
            f"etcd revision {done.before} is already above the store's largest owner_epoch "
            f"{done.top_epoch} (partition {done.partition}): nothing to do"
        )
    else:
        click.echo(
            f"etcd revision {done.before} -> {done.after}, above the store's largest owner_epoch "
            f"{done.top_epoch} (partition {done.partition}): nodes may start with --coordinator etcd"
        )


@cli.command("demo")
@option(
    "--seconds", default=30, show_default=True, type=WholeNumber("seconds", 5, 3600), help="How long the node runs."
)
@option(
    "--dsn",
    envvar="SCHEDULER_DEMO_DSN",
    show_envvar=True,
    default="",
    help="Use this (empty, disposable) database instead of a private PostgreSQL.",
)
def demo_cmd(seconds: int, dsn: str) -> None:
    """Run the whole thing on a private PostgreSQL: import the real corpus, fire for SECONDS, audit.

    Exits non-zero if any due (job, nominal time) is missing or duplicated.
    """
    from scheduler.devtools.demo import run_demo

    sys.exit(run_demo(seconds, dsn or None))


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="scheduler")
