"""The Grafana dashboard and the Prometheus alerts use only metrics the gateway really has: the
names its /metrics exposes after a small run, or (for those that appear only after specific
events, e.g. failures) the names declared in src/."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa

from conftest import PROJECT, TOKEN, Gateway
from filament_bigquery import Client

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "filament-bigquery.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
METRIC = re.compile(r"\bfilament_[a-z0-9_]+\b")
SUFFIXES = ("_bucket", "_sum", "_count")


def declared_metrics() -> set[str]:
    """Names declared as constants (src/telemetry.rs), and literal names recorded anywhere in src/."""
    names: set[str] = set()
    for path in (ROOT / "src").rglob("*.rs"):
        text = path.read_text()
        names.update(re.findall(r'const \w+: &str = "(filament_[a-z0-9_]+)"', text))
        names.update(re.findall(r'(?:counter|gauge|histogram)!\(\s*"(filament_[a-z0-9_]+)"', text))
    assert len(names) >= 10, names
    return names


def exposed_metrics(text: str) -> tuple[set[str], dict[str, str]]:
    """(sample names, {family: type}) of a Prometheus text exposition."""
    samples: set[str] = set()
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            types[name] = kind
        elif line and not line.startswith("#"):
            samples.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return samples, types


def unknown_names(used: set[str], samples: set[str], types: dict[str, str], declared: set[str]) -> list[str]:
    unknown = []
    for name in sorted(used):
        if name in samples:
            continue
        base = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s)), name)
        if base in types:
            # Exposed family: the suffix must exist for its type (summaries have no _bucket).
            allowed = {"histogram": SUFFIXES, "summary": ("_sum", "_count")}.get(types[base], ())
            if base == name or any(name == base + s for s in allowed):
                continue
            unknown.append(name)
        elif base in declared:
            continue  # declared, appears only after specific events
        else:
            unknown.append(name)
    return unknown


def drive_a_run(gateway: Gateway) -> None:
    with Client(gateway.url, token=TOKEN) as client:
        run = client.create_run(project=PROJECT, dataset="client_metrics")
        run.declare("m", write_mode="full_append")
        with run.execution() as ex:
            ex.write("m", pa.table({"id": list(range(100))}))
    with Client(gateway.url, token=TOKEN) as client:
        client.ready()


def test_dashboard_and_alerts_use_real_metrics(gateway: Gateway) -> None:
    drive_a_run(gateway)
    samples, types = exposed_metrics(gateway.metrics())
    declared = declared_metrics()
    # The run produced the everyday metrics: the check below really compares against /metrics.
    for expected in ("filament_rows_received_total", "filament_rows_appended_total", "filament_http_requests_total"):
        assert expected in samples, sorted(samples)
    # Every exposed family is declared in src/ (so the declared list is a fair fallback).
    for family in types:
        assert family in declared, f"{family} exposed but not declared in src/"

    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    expressions += [dashboard["templating"]["list"][1]["definition"]]
    assert len(expressions) >= 20
    dashboard_names = {name for expr in expressions for name in METRIC.findall(expr)}
    assert unknown_names(dashboard_names, samples, types, declared) == []
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel.get("targets"), panel["title"]

    alert_names = set(METRIC.findall(ALERTS.read_text()))
    assert len(alert_names) >= 5
    assert unknown_names(alert_names, samples, types, declared) == []


def test_unknown_names_are_caught() -> None:
    samples, types = exposed_metrics(
        "# TYPE filament_a_seconds summary\nfilament_a_seconds{quantile=\"0.5\"} 1\n"
        "filament_a_seconds_sum 1\nfilament_a_seconds_count 1\n"
    )
    declared = {"filament_a_seconds", "filament_b_total"}
    assert unknown_names({"filament_a_seconds_bucket", "filament_b_total", "filament_c_total"}, samples, types, declared) == [
        "filament_a_seconds_bucket",
        "filament_c_total",
    ]
