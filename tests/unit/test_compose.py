"""compose.yaml and deploy/ checked against the CLI (no container engine runs here).

Parses the compose file with PyYAML (anchors and merge keys resolved) and
checks: the default services are a 3-node CockroachDB cluster with its init
job, a migration job, three scheduler nodes and Prometheus; PostgreSQL and
the bench runner sit behind their profiles; every ``scheduler ...`` command
parses with the real click commands under the service's environment (unknown
commands or options, bad values and invalid settings fail here); node
metrics ports agree with the published ports and with Prometheus' targets;
the alert rules only name metrics a node exposes.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import click
import pytest
import yaml
from prometheus_client import generate_latest

from bench.__main__ import cli as bench_cli
from scheduler.cli import _resolve_settings
from scheduler.cli import cli as scheduler_cli
from scheduler.metrics import Metrics
from scheduler.settings import Settings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "compose.yaml").read_text(encoding="utf-8"))
SERVICES: dict[str, dict] = COMPOSE["services"]
PROMETHEUS = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text(encoding="utf-8"))
ALERTS = yaml.safe_load((REPO / "deploy" / "alerts.yml").read_text(encoding="utf-8"))

DEFAULT = {"crdb-1", "crdb-2", "crdb-3", "crdb-init", "migrate", "node-1", "node-2", "node-3", "prometheus"}
PROFILES = {
    "postgres": {"postgres", "migrate-postgres", "pg-node-1", "pg-node-2", "pg-node-3"},
    "postgres-ha": {
        "etcd-ha",
        "patroni-1",
        "patroni-2",
        "patroni-init",
        "migrate-ha",
        "ha-node-1",
        "ha-node-2",
        "ha-node-3",
    },
    "bench": {"bench"},
}
MIGRATION_OF = {None: "migrate", "postgres": "migrate-postgres", "postgres-ha": "migrate-ha"}
"""The migration job every node of a profile waits for."""
PATRONI_CONFIG = yaml.safe_load((REPO / "deploy" / "patroni" / "patroni.yml").read_text(encoding="utf-8"))


def services_in(profile: str | None) -> set[str]:
    return {
        name
        for name, svc in SERVICES.items()
        if (profile in svc.get("profiles", []) if profile else not svc.get("profiles"))
    }


def scheduler_services() -> dict[str, dict]:
    return {name: svc for name, svc in SERVICES.items() if (svc.get("command") or [None])[0] == "scheduler"}


def node_services() -> dict[str, dict]:
    return {name: svc for name, svc in scheduler_services().items() if svc["command"][1] == "node"}


def parse(group: click.Group, prog: str, args: list[str]) -> click.Context:
    """Parse ``args`` down to the leaf command without invoking anything; raise on any usage error."""
    ctx = group.make_context(prog, list(args))
    command: click.Command = group
    while isinstance(command, click.Group):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        name, command, rest = command.resolve_command(ctx, rest)
        assert command is not None, args
        ctx = command.make_context(name, rest, parent=ctx)
    assert not ctx.args, f"unexpected arguments {ctx.args}"
    return ctx


@pytest.fixture
def service_env(monkeypatch):
    """Apply a service's environment (and only it) to os.environ."""

    def apply(service: dict) -> None:
        for key in list(os.environ):
            if key.startswith("SCHEDULER_"):
                monkeypatch.delenv(key)
        for key, value in (service.get("environment") or {}).items():
            monkeypatch.setenv(key, str(value))

    return apply


def test_services_and_profiles():
    assert services_in(None) == DEFAULT
    for profile, names in PROFILES.items():
        assert services_in(profile) == names


def test_cockroach_cluster_is_three_joined_nodes_initialised_once():
    for name in ("crdb-1", "crdb-2", "crdb-3"):
        command = SERVICES[name]["command"]
        assert command[:2] == ["start", "--insecure"]
        join = next(arg for arg in command if arg.startswith("--join="))
        assert set(join.removeprefix("--join=").split(",")) == {"crdb-1:26257", "crdb-2:26257", "crdb-3:26257"}
    script = SERVICES["crdb-init"]["command"][0]
    assert "cockroach init" in script and "already been initialized" in script
    assert "CREATE DATABASE IF NOT EXISTS scheduler" in script and "CREATE DATABASE IF NOT EXISTS bench" in script
    assert "experimental_enable_temp_tables" in script  # `scheduler verify` uses temporary tables
    assert SERVICES["migrate"]["depends_on"]["crdb-init"]["condition"] == "service_completed_successfully"


def test_depends_on_names_real_services():
    for name, svc in SERVICES.items():
        deps = svc.get("depends_on") or []
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in SERVICES, (name, dep)
            # a default service never waits for a profile-only one
            if not svc.get("profiles"):
                assert not SERVICES[dep].get("profiles"), (name, dep)


@pytest.mark.parametrize("name", sorted(scheduler_services()))
def test_scheduler_commands_parse_with_the_real_cli(name, service_env):
    service = SERVICES[name]
    service_env(service)
    ctx = parse(scheduler_cli, "scheduler", service["command"][1:])
    assert ctx.command_path.startswith("scheduler ")
    if ctx.info_name == "upgrade":
        assert ctx.params["dsn"]


@pytest.mark.parametrize("name", sorted(node_services()))
def test_nodes_serve_metrics_on_the_network_and_are_valid(name, service_env):
    service = SERVICES[name]
    service_env(service)
    ctx = parse(scheduler_cli, "scheduler", service["command"][1:])
    settings, sources = _resolve_settings(ctx, dict(ctx.params))
    settings = settings.validated()
    assert settings.node_id == name
    assert (settings.metrics_host, settings.metrics_port) == ("0.0.0.0", 9464)
    assert sources["metrics_port"] == "flag" and sources["dsn"] == "env"
    assert settings.log_format == "json"
    assert settings.retention_s == 7 * 86_400
    store = "cockroachdb://" if not service.get("profiles") else "postgresql://"
    assert settings.dsn.startswith(store)
    assert service["stop_signal"] == "SIGTERM"
    (profile,) = service.get("profiles") or [None]
    assert service["depends_on"][MIGRATION_OF[profile]]["condition"] == "service_completed_successfully"
    # the healthcheck probes the same port's /readyz
    assert f"127.0.0.1:{settings.metrics_port}/readyz" in " ".join(service["healthcheck"]["test"])
    published = [p.split(":") for p in service["ports"]]
    assert [(host, int(container)) for host, _, container in published] == [("127.0.0.1", settings.metrics_port)]


def test_published_ports_do_not_collide():
    seen: dict[str, str] = {}
    for name, svc in SERVICES.items():
        for mapping in svc.get("ports", []):
            host_port = mapping.rsplit(":", 2)[-2] if mapping.count(":") >= 2 else mapping.split(":")[0]
            assert host_port not in seen, (name, seen.get(host_port), host_port)
            seen[host_port] = name


def test_nodes_of_one_store_spread_over_the_cockroach_nodes(service_env):
    hosts = set()
    for name in ("node-1", "node-2", "node-3"):
        hosts.add(re.search(r"@([\w-]+):", SERVICES[name]["environment"]["SCHEDULER_DSN"]).group(1))
    assert hosts == {"crdb-1", "crdb-2", "crdb-3"}


def test_ha_profile_is_a_patroni_pair_on_etcd_and_nodes_on_the_multi_host_dsn(service_env):
    members = {"patroni-1", "patroni-2"}
    for name in members:
        service = SERVICES[name]
        env = service["environment"]
        assert env["PATRONI_NAME"] == name and service["hostname"] == name
        assert env["PATRONI_POSTGRESQL_CONNECT_ADDRESS"] == f"{name}:5432"
        assert env["PATRONI_RESTAPI_CONNECT_ADDRESS"] == f"{name}:8008"
        assert env["PATRONI_ETCD_HOSTS"] == "etcd-ha:2379" and env["PATRONI_SCOPE"] == "scheduler"
        assert service["build"]["context"] == "deploy/patroni"
        assert service["depends_on"] == ["etcd-ha"]
    assert {"--advertise-client-urls", "--enable-v2"} <= set(SERVICES["etcd-ha"]["command"])  # Patroni's etcd client
    dcs = PATRONI_CONFIG["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] is True and not dcs.get("synchronous_mode_strict")  # two members: never strict
    assert dcs["loop_wait"] + 2 * dcs["retry_timeout"] <= dcs["ttl"]
    assert PATRONI_CONFIG["postgresql"]["listen"].endswith(":5432")
    assert PATRONI_CONFIG["restapi"]["listen"].endswith(":8008")
    # every engine service of the profile uses one DSN naming both members, writes only on the primary
    dsns = {
        SERVICES[name]["environment"]["SCHEDULER_DSN"]
        for name in PROFILES["postgres-ha"]
        if name.startswith(("migrate", "ha-node"))
    }
    (dsn,) = dsns
    assert dsn.startswith("postgresql://") and "@patroni-1:5432,patroni-2:5432/scheduler?" in dsn
    assert "target_session_attrs=read-write" in dsn and "connect_timeout=" in dsn
    init = SERVICES["patroni-init"]["command"][0]
    assert "target_session_attrs=read-write" in init and "CREATE DATABASE scheduler OWNER scheduler" in init
    assert SERVICES["migrate-ha"]["depends_on"]["patroni-init"]["condition"] == "service_completed_successfully"


def test_bench_runs_the_herd_through_the_bench_cli(service_env):
    service = SERVICES["bench"]
    assert service["command"][:3] == ["python", "-m", "bench"]
    service_env(service)
    ctx = parse(bench_cli, "bench", service["command"][3:])
    assert ctx.info_name == "herd"
    assert ctx.params["dsn"].endswith("/bench?sslmode=disable")  # never the engine's own database
    assert "bench" in service["build"]["args"]["EXTRAS"]


def test_prometheus_scrapes_every_node_on_its_metrics_port():
    volumes = SERVICES["prometheus"]["volumes"]
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in volumes
    assert "./deploy/alerts.yml:/etc/prometheus/alerts.yml:ro" in volumes
    assert PROMETHEUS["rule_files"] == ["/etc/prometheus/alerts.yml"]
    targets = {
        target for job in PROMETHEUS["scrape_configs"] for group in job["static_configs"] for target in group["targets"]
    }
    expected = set()
    for name, svc in node_services().items():
        port = svc["command"][svc["command"].index("--metrics-port") + 1]
        expected.add(f"{name}:{port}")
    assert targets == expected
    assert all(job["metrics_path"] == "/metrics" for job in PROMETHEUS["scrape_configs"])


def test_alert_rules_only_use_metrics_a_node_exposes():
    exposed = set(re.findall(r"^(scheduler_\w+?)(?:\{| )", generate_latest(Metrics().registry).decode(), re.M))
    rules = [rule for group in ALERTS["groups"] for rule in group["rules"]]
    assert len(rules) >= 8
    used = set()
    for rule in rules:
        names = set(re.findall(r"\bscheduler_\w+", rule["expr"]))
        assert names <= exposed, (rule["alert"], names - exposed)
        used |= names
    for family in (
        "scheduler_firing_dispatch_lag_seconds_bucket",
        "scheduler_lease_partitions_owned",
        "scheduler_firing_due_backlog_runs",
        "scheduler_membership_heartbeat_age_seconds",
        "scheduler_store_errors_total",
        "scheduler_firing_fence_rejections_total",
    ):
        assert family in used


def test_settings_fields_reachable_from_compose_env_names():
    """Every SCHEDULER_* variable in compose names a real setting (a typo would be silently ignored)."""
    fields = {f"SCHEDULER_{f.name.upper()}" for f in dataclasses.fields(Settings)}
    for name, svc in SERVICES.items():
        for key in svc.get("environment") or {}:
            if key.startswith("SCHEDULER_"):
                assert key in fields, (name, key)
