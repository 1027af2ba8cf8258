"""docs/grafana/eos-broker.json: a dashboard Grafana can import, whose every query names a
metric the broker exports, with labels it carries.

The names are checked against a real scrape, not a list kept here: an in-process broker with
metrics.port serves /metrics after a tiny workload (a topic produced to, a group's commit, one
storage error counted), so that every labelled family has samples to compare with.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import eos
from broker.server import BrokerServer
from eos.types import TopicPartition
from tests.metrics import scrape
from tests.waits import wait_for

DASHBOARD_PATH = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "eos-broker.json"
GRID_COLUMNS = 24
# Prometheus adds these to every series it scrapes; the broker's exposition does not show them.
TARGET_LABELS = frozenset({"instance", "job"})

# ---- reading PromQL, as far as the dashboard uses it ----------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}")
_MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")     # the dashboard aggregates with `by` only
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_CALLED = re.compile(r"\s*\(")
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                       "unless", "offset", "inf", "nan"})
_LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
_LABEL_VALUES = re.compile(r"^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$")


class Query:
    """One PromQL expression's metric names, the labels each selector matches on, and the
    labels of its `by (...)` clauses, outermost first. Anything else in parentheses after an
    aggregation (`without`, `on`) reads as a metric name and fails the check loudly."""

    def __init__(self, expr: str):
        text = _STRING.sub('""', expr)          # label values ($instance, regexes) are not names
        self.selector_labels: dict[str, set[str]] = {}
        for name, body in _SELECTOR.findall(text):
            assert name, f"a selector without a metric name in {expr!r}"
            self.selector_labels.setdefault(name, set()).update(_MATCHER_LABEL.findall(body))
        self.grouping_labels = [{label.strip() for label in labels.split(",") if label.strip()}
                                for labels in _GROUPING.findall(text)]
        bare = _RANGE.sub(" ", _GROUPING.sub(" ", _SELECTOR.sub(lambda m: f" {m.group(1)} ", text)))
        self.metrics = {m.group() for m in _IDENTIFIER.finditer(bare)
                        if m.group() not in _KEYWORDS and not _CALLED.match(bare, m.end())}


def test_query_reading_finds_metrics_labels_and_groupings():
    query = Query('histogram_quantile(0.99, sum by (le, request) '
                  '(rate(eos_network_request_duration_seconds_bucket{instance=~"$instance", error!="x{y}"}'
                  '[$__rate_interval])))')
    assert query.metrics == {"eos_network_request_duration_seconds_bucket"}
    assert query.selector_labels == {"eos_network_request_duration_seconds_bucket": {"instance", "error"}}
    assert query.grouping_labels == [{"le", "request"}]
    assert Query("rate(process_cpu_seconds_total[5m]) / process_max_fds").metrics == \
        {"process_cpu_seconds_total", "process_max_fds"}


# ---- the dashboard's shape -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD_PATH.read_text())


def all_panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside collapsed rows included."""
    return [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]


def queries_of(dashboard: dict) -> list[tuple[str, dict]]:
    """(panel title, target) of every query target."""
    return [(panel["title"], target) for panel in all_panels(dashboard) for target in panel.get("targets", [])]


def test_the_dashboard_has_the_shape_grafana_imports(dashboard):
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["title"] and dashboard["uid"] and dashboard.get("id") is None
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["definition"] == "label_values(eos_server_ready, instance)"

    panels = all_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    taken: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert grid["w"] > 0 and grid["h"] > 0 and 0 <= grid["x"] and grid["x"] + grid["w"] <= GRID_COLUMNS, \
            panel["title"]
        for cell in ((x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                     for y in range(grid["y"], grid["y"] + grid["h"])):
            assert cell not in taken, f"{panel['title']!r} overlaps {taken[cell]!r}"
            taken[cell] = panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]


# ---- every name against a running broker ------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, set[str]]:
    """{sample name: the label names its samples carry} from a broker's /metrics."""
    server = BrokerServer(tmp_path_factory.mktemp("dashboard-broker"), port=0, config={"metrics.port": "0"})
    server.start()
    try:
        wait_for(lambda: server.ready, "the broker to be ready")
        with eos.Admin(server.address) as admin:
            admin.create_topic("dash", partitions=1)
        with eos.Producer(server.address) as producer:
            producer.send("dash", b"x")
            producer.flush()
        with eos.Consumer(server.address, group_id="dash-group") as consumer:
            consumer.assign([TopicPartition("dash", 0)])
            consumer.commit({TopicPartition("dash", 0): 0})      # a committed offset: the group has lag
        # one counted storage error gives its family a sample (the disk path is the
        # integration test's, tests/integration/test_broker_metrics.py)
        server.servicer.storage_errors.record("dash", 0, str(server.data_dir), "No space left on device")
        scraped = scrape(f"http://127.0.0.1:{server.metrics_port}/metrics")
    finally:
        server.stop()
    labels: dict[str, set[str]] = {}
    for name, sample_labels in scraped.samples:
        labels.setdefault(name, set()).update(label for label, _ in sample_labels)
    return labels


def test_every_query_names_an_exported_metric_and_its_labels(dashboard, exported):
    problems = []
    for title, target in queries_of(dashboard):
        query = Query(target["expr"])
        assert query.metrics, f"{title!r}: no metric in {target['expr']!r}"
        for metric in sorted(query.metrics):
            if metric not in exported:
                problems.append(f"{title!r}: {metric} is not exported")
                continue
            carried = exported[metric] | TARGET_LABELS
            problems += [f"{title!r}: {metric} has no label {label!r} to select on"
                         for label in sorted(query.selector_labels.get(metric, set()) - carried)]
            problems += [f"{title!r}: {metric} has no label {label!r} to group by"
                         for grouping in query.grouping_labels for label in sorted(grouping - carried)]
        # a legend can name only the labels the result keeps: the outermost grouping's, if any
        legend_labels = set(_LEGEND_LABEL.findall(target.get("legendFormat", "")))
        kept = (query.grouping_labels[0] if query.grouping_labels
                else set().union(*(exported.get(m, set()) for m in query.metrics)) | TARGET_LABELS)
        problems += [f"{title!r}: the legend's {label!r} is not in the result"
                     for label in sorted(legend_labels - kept)]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        found = _LABEL_VALUES.match(variable["definition"])
        assert found, f"variable {variable['name']}: {variable['definition']!r} is not label_values(metric, label)"
        metric, label = found.groups()
        if label not in exported.get(metric, set()) | TARGET_LABELS:
            problems.append(f"variable {variable['name']}: {metric} has no label {label!r}")
    assert not problems, "\n".join(problems)
