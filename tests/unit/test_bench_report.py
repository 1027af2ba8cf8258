"""bench/report.py: ratios, verdicts, spreads and the summary; bench.workloads.median_of_runs.

No timing here: the rows are made up, the figures are what the report must print."""
from __future__ import annotations

import json

import pytest

from bench import host_speed, report
from bench.workloads import Metric, median_of_runs, median_low


def _metric(key, value, *, unit="records/s", higher=True, samples=(), restates="",
            label=None, note=""):
    return Metric(key, label or key, value, unit, higher, note, tuple(samples),
                  restates).to_dict()


def _run(workloads: list[tuple[str, dict[str, list[dict]]]], repeats: int = 3) -> dict:
    """A run dict as the harness builds it: (name, {system: metrics}) per workload."""
    return {
        "command": "python -m bench", "mode": "full", "duration_s": 12.0,
        "started_utc": "2026-11-22T01:00:00+00:00",
        "sizes": {"repeats": repeats},
        "machine": {"hostname": "box", "cpu_model": "cpu", "cores": 2, "memory_gib": 4.0,
                    "python": "3.11", "java": "openjdk 17", "eos_commit": "abc",
                    "loadavg_at_start": [1.0, 1.0, 1.0], "loadavg_at_end": [1.0, 1.0, 1.0]},
        "systems": {"eos": {"status": "ok", "version": "0.1"},
                    "kafka": {"status": "ok", "version": "4.3.1"}},
        "workloads": [{"name": name, "title": f"{name} title",
                       "results": {system: {"status": "ok", "metrics": metrics,
                                            "elapsed_s": 1.0}
                                   for system, metrics in by_system.items()}}
                      for name, by_system in workloads],
    }


def _duplicates_run(eos_value, kafka_value) -> dict:
    return _run([("spark", {
        "eos": [_metric("spark.duplicates_after_kill", eos_value, unit="records",
                        higher=False, label="duplicates after a kill")],
        "kafka": [_metric("spark.duplicates_after_kill", kafka_value, unit="records",
                          higher=False, label="duplicates after a kill")],
    })])


# ---------------------------------------------------------------- ratio and verdict

def test_ratio_is_eos_over_kafka_when_higher_is_better():
    assert report.ratio(200.0, 100.0, True) == 2.0
    assert report.verdict(200.0, 100.0, True) == report.EOS_BETTER


def test_ratio_is_kafka_over_eos_when_lower_is_better():
    assert report.ratio(2.0, 8.0, False) == 4.0
    assert report.verdict(8.0, 2.0, False) == report.KAFKA_BETTER


@pytest.mark.parametrize("eos_value, kafka_value, expected", [
    (0, 1234, report.EOS_BETTER),
    (1234, 0, report.KAFKA_BETTER),
    (0, 0, report.EVEN),
])
def test_zero_where_lower_is_better_gives_a_verdict_not_a_division(eos_value, kafka_value,
                                                                   expected):
    assert report.verdict(eos_value, kafka_value, False) == expected
    assert report.ratio(eos_value, kafka_value, False) is None


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf")])
def test_missing_or_non_finite_values_give_neither_ratio_nor_verdict(bad):
    assert report.ratio(bad, 1.0, True) is None
    assert report.verdict(bad, 1.0, True) is None
    assert report.verdict(1.0, bad, False) is None


def test_duplicates_eos_zero_against_kafka_reads_eos_better_everywhere():
    run = _duplicates_run(0, 1234)
    [row] = report.rows(run)
    assert row["ratio"] is None and row["verdict"] == report.EOS_BETTER
    text = report.markdown(run) + report.console_table(run)
    assert "eos 0 vs 1,234: eos better" in text
    assert "inf" not in text.lower() and "nan" not in text.lower()
    counts = report.summary(report.rows(run))
    assert [r["key"] for r in counts["ahead"]] == ["spark.duplicates_after_kill"]
    assert counts["behind"] == []
    json.dumps(report.rows(run), allow_nan=False)    # strict JSON: no NaN or Infinity


def test_both_zero_is_even_and_kafka_zero_is_kafka_better():
    assert "eos 0 vs 0: even" in report.markdown(_duplicates_run(0, 0))
    run = _duplicates_run(7, 0)
    assert "eos 7 vs 0: Kafka better" in report.markdown(run)
    assert len(report.summary(report.rows(run))["behind"]) == 1


# ---------------------------------------------------------------- spread

def test_spread_shows_min_max_and_number_of_runs():
    assert report._spread_cell([300, 100, 200]) == "100–300 (3)"
    assert report._spread_cell([1.5]) == "1 run"
    assert report._spread_cell([]) == "-"


@pytest.mark.parametrize("eos_samples, kafka_samples, expected", [
    ([100, 120, 110], [130, 150, 140], False),
    ([100, 135, 110], [130, 150, 140], True),
    ([100], [130, 150, 140], None),
])
def test_ranges_overlap(eos_samples, kafka_samples, expected):
    assert report.ranges_overlap(eos_samples, kafka_samples) is expected


def test_markdown_shows_each_systems_spread_and_flags_overlap_in_the_summary():
    run = _run([("produce", {
        "eos": [_metric("p.records_per_s", 110, samples=(100, 135, 110))],
        "kafka": [_metric("p.records_per_s", 140, samples=(130, 150, 140))],
    })])
    text = report.markdown(run)
    assert "| p.records_per_s (records/s) | 110 | 100–135 (3) | 140 | 130–150 (3) | 0.79x |" \
        in text
    assert "Within the noise" in text
    [row] = report.rows(run)
    assert row["samples"] == {"eos": [100, 135, 110], "kafka": [130, 150, 140]}


# ---------------------------------------------------------------- summary and grouping

def test_summary_counts_ahead_and_behind_and_skips_restated_rows():
    run = _run([
        ("produce", {
            "eos": [_metric("p.records_per_s", 100), _metric("p.mb_per_s", 10.0, unit="MB/s",
                                                             restates="p.records_per_s")],
            "kafka": [_metric("p.records_per_s", 300), _metric("p.mb_per_s", 30.0,
                                                               unit="MB/s",
                                                               restates="p.records_per_s")],
        }),
        ("latency", {
            "eos": [_metric("l.p50_ms", 1.0, unit="ms", higher=False)],
            "kafka": [_metric("l.p50_ms", 5.0, unit="ms", higher=False)],
        }),
    ])
    counts = report.summary(report.rows(run))
    assert counts["compared"] == 2
    assert [r["key"] for r in counts["ahead"]] == ["l.p50_ms"]
    assert [r["key"] for r in counts["behind"]] == ["p.records_per_s"]
    text = report.markdown(run)
    assert "**ahead on 1** of the 2 figures" in text and "**behind on 1**" in text
    assert "Behind: produce: p.records_per_s (records/s) 0.33x." in text


def test_markdown_groups_rows_by_workload_after_the_summary():
    run = _run([
        ("produce", {"eos": [_metric("a", 1.0), _metric("b", 2.0)],
                     "kafka": [_metric("a", 1.5), _metric("b", 2.5)]}),
        ("copier", {"eos": [_metric("c", 3.0)], "kafka": [_metric("c", 4.0)]}),
    ])
    text = report.markdown(run)
    summary_at = text.index("## Summary")
    produce_at = text.index("## produce: produce title")
    copier_at = text.index("## copier: copier title")
    assert summary_at < produce_at < copier_at
    assert text.count("## produce") == 1
    produce_section = text[produce_at:copier_at]
    assert "| a (records/s) |" in produce_section and "| b (records/s) |" in produce_section
    assert "| c (records/s) |" not in produce_section and "| c (records/s) |" in text


def test_the_header_gives_the_python_speed_probe_at_the_start_and_the_end():
    run = _run([("produce", {"eos": [_metric("a", 1.0)], "kafka": [_metric("a", 1.5)]})])
    run["machine"].update({"python_probe_ms_at_start": 84.4, "python_probe_ms_at_end": 131.0})
    header = report.markdown(run).split("## produce")[0]
    assert "Python speed probe" in header
    assert "84 ms at the start, 131 at the end." in header


def test_a_run_recorded_before_the_probe_existed_has_no_probe_sentence():
    run = _run([("produce", {"eos": [_metric("a", 1.0)], "kafka": [_metric("a", 1.5)]})])
    assert "Python speed probe" not in report.markdown(run)
    run["machine"]["python_probe_ms_at_start"] = 80.0      # a run that stopped before its end
    assert "Python speed probe" not in report.markdown(run)


def test_the_python_probe_is_the_median_of_its_repeats_in_ms():
    readings = iter([0.0, 0.010, 1.0, 1.030, 2.0, 2.020])   # runs of 10, 30 and 20 ms
    assert host_speed.python_probe_ms(repeats=3, iterations=10, timer=lambda: next(readings)) == 20.0
    with pytest.raises(ValueError, match="at least 1"):
        host_speed.python_probe_ms(repeats=0)


def test_legacy_runs_without_restates_count_mb_per_s_once():
    run = _run([("produce", {
        "eos": [{"key": "p.records_per_s", "label": "r", "value": 1.0, "unit": "records/s",
                 "higher_is_better": True, "note": ""},
                {"key": "p.mb_per_s", "label": "m", "value": 0.1, "unit": "MB/s",
                 "higher_is_better": True, "note": ""}],
        "kafka": [{"key": "p.records_per_s", "label": "r", "value": 2.0, "unit": "records/s",
                   "higher_is_better": True, "note": ""},
                  {"key": "p.mb_per_s", "label": "m", "value": 0.2, "unit": "MB/s",
                   "higher_is_better": True, "note": ""}],
    })])
    assert report.summary(report.rows(run))["compared"] == 1


def test_a_system_without_figures_shows_its_status_not_a_verdict():
    run = _run([("append-storage", {"eos": [_metric("s.mb_per_s", 2500.0, unit="MB/s")]})])
    run["workloads"][0]["results"]["kafka"] = {"status": "not available", "detail": "JVM"}
    [row] = report.rows(run)
    assert row["verdict"] is None and row["kafka"] is None
    text = report.markdown(run)
    assert "| n/a |" in text and "No figure was measured on both systems." in text


def test_plot_draws_zero_rows_and_new_units(tmp_path):
    run = _run([
        ("produce", {"eos": [_metric("p.records_per_s", 100, samples=(90, 100, 120))],
                     "kafka": [_metric("p.records_per_s", 300, samples=(280, 300, 310))]}),
        ("spark", {"eos": [_metric("spark.duplicates_after_kill", 0, unit="records",
                                   higher=False)],
                   "kafka": [_metric("spark.duplicates_after_kill", 1234, unit="records",
                                     higher=False)]}),
    ])
    path = report.plot(run, tmp_path / "run.png")
    assert path is not None and path.stat().st_size > 0
    titles = [title for title, _rows in report._plot_panels(report.rows(run))]
    assert any("records, lower is better" in t for t in titles)


# ---------------------------------------------------------------- median_of_runs

def test_median_of_runs_keeps_every_sample_and_the_median_runs_note():
    runs = [[Metric("x", "x", value, "ms", False, f"run {i}")]
            for i, value in enumerate((5.0, 9.0, 1.0))]
    [folded] = median_of_runs(runs)
    assert folded.value == 5.0 and folded.note == "run 0"
    assert folded.samples == (5.0, 9.0, 1.0)
    assert folded.to_dict()["samples"] == [5.0, 9.0, 1.0]


def test_median_low_of_an_even_count_is_a_run_that_happened():
    assert median_low([4.0, 1.0, 3.0, 2.0]) == 2.0
    with pytest.raises(ValueError):
        median_low([])


def test_median_of_runs_refuses_runs_with_different_keys():
    with pytest.raises(ValueError, match="run 2 reported keys"):
        median_of_runs([[Metric("a", "a", 1.0, "ms")], [Metric("b", "b", 1.0, "ms")]])


def test_single_run_metric_has_no_samples_in_json():
    assert "samples" not in Metric("a", "a", 1.0, "ms").to_dict()
