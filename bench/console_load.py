"""What the web console's topics page costs with many topics: server time and a browser's load time.

    .venv/bin/python -m bench.console_load [--topics 1000] [--partitions 1] [--repeats 5] [--json-only]

Theory of operation
-------------------
One eos broker process (bench/eos_server.py, so the console does not share its interpreter
with the broker, as in production) gets --topics topics of --partitions partitions, created
in batches of CREATE_BATCH_TOPICS per CreateTopics, with one 100-byte record in each
partition so that every size is non-zero. The console (eos.console: the Flask app under
waitress, on a thread of this process) is started over an eos.Admin whose public methods are
counted, so the run shows how many Admin calls (and so RPCs) one page load makes: the page
must batch them (one Metadata for every topic, one DescribeLogDirs per broker), not make one
per topic.

Measured, each --repeats times after one unmeasured warm-up load, median (min-max) reported:
- server: GET /topics with urllib: the app's own time from its Server-Timing header (Admin
  calls + rendering) and the wall time of the whole HTTP exchange; the same for /api/topics
  (the JSON of the same page, no template);
- chromium (Debian's, through Playwright, as the tests use it): page.goto of /topics, then
  the Navigation Timing of the load: responseEnd - requestStart (server and transfer),
  domContentLoadedEventEnd and loadEventEnd since navigation start (parsing and layout of
  the table of every topic).
Without /usr/bin/chromium or Playwright the browser figures say why they are missing.

Output: one JSON object on stdout (--json-only for it alone), then a table.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
import urllib.request

from bench.eos_server import EosBroker
from bench.report import print_results, text_table

CREATE_BATCH_TOPICS = 200
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
NAVIGATION_TIMING_JS = """() => {
  const n = performance.getEntriesByType("navigation")[0];
  return {response_ms: n.responseEnd - n.requestStart, dom_content_loaded_ms: n.domContentLoadedEventEnd,
          load_ms: n.loadEventEnd, transfer_bytes: n.transferSize};
}"""


class CountingAdmin:
    """An eos.Admin whose public method calls are counted (what one page load asks)."""

    def __init__(self, admin):
        self._admin = admin
        self.calls: collections.Counter = collections.Counter()

    def __getattr__(self, name: str):
        attribute = getattr(self._admin, name)
        if name.startswith("_") or not callable(attribute):
            return attribute

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attribute(*args, **kwargs)
        return counted


def _summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
            "max": round(max(values), 1), "samples": [round(v, 1) for v in values]}


def _fill(eos, bootstrap: str, topics: int, partitions: int) -> list[str]:
    names = [f"load-{i:05d}" for i in range(topics)]
    with eos.Admin(bootstrap, default_api_timeout_ms=300_000, request_timeout_ms=120_000) as admin:
        for start in range(0, topics, CREATE_BATCH_TOPICS):
            admin.create_topics([{"name": name, "partitions": partitions}
                                 for name in names[start:start + CREATE_BATCH_TOPICS]])
    with eos.Producer(bootstrap, linger_ms=5) as producer:
        for name in names:
            for partition in range(partitions):
                producer.send(name, value=b"x" * 100, partition=partition)
        producer.flush()
    return names


def _server_loads(url: str, repeats: int) -> dict:
    app_ms, wall_ms, size_bytes = [], [], 0
    for attempt in range(repeats + 1):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as response:
            body = response.read()
            timing = response.headers["Server-Timing"]
        elapsed_ms = (time.perf_counter() - started) * 1000
        if attempt == 0:
            continue                      # warm-up: first Jinja compile, channels opened
        app_ms.append(float(timing.split("dur=")[1]))
        wall_ms.append(elapsed_ms)
        size_bytes = len(body)
    return {"app_ms": _summary(app_ms), "http_ms": _summary(wall_ms), "body_bytes": size_bytes}


def _browser_loads(url: str, repeats: int) -> dict:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        return {"unavailable": f"playwright is not installed ({exc})"}
    import os
    if not os.access(CHROMIUM, os.X_OK):
        return {"unavailable": f"{CHROMIUM} is not installed (apt-get install chromium)"}
    figures = collections.defaultdict(list)
    rows = 0
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            for attempt in range(repeats + 1):
                page.goto(url, wait_until="load", timeout=120_000)
                timing = page.evaluate(NAVIGATION_TIMING_JS)
                rows = page.locator("#topics tbody tr").count()
                if attempt == 0:
                    continue
                for key in ("response_ms", "dom_content_loaded_ms", "load_ms"):
                    figures[key].append(timing[key])
        finally:
            browser.close()
    return {**{key: _summary(values) for key, values in figures.items()}, "table_rows": rows}


def run(topics: int, partitions: int, repeats: int) -> dict:
    import eos
    from eos.console import ConsoleServer, create_app

    with EosBroker() as broker:
        started = time.perf_counter()
        _fill(eos, broker.bootstrap, topics, partitions)
        fill_s = time.perf_counter() - started
        with eos.Admin(broker.bootstrap) as admin:
            counting = CountingAdmin(admin)
            with ConsoleServer(create_app(counting), port=0) as console:
                urllib.request.urlopen(console.url + "/topics", timeout=120).read()   # connect, compile
                counting.calls.clear()
                urllib.request.urlopen(console.url + "/topics", timeout=120).read()
                calls_per_load = dict(counting.calls)
                results = {
                    "topics": topics, "partitions_per_topic": partitions, "repeats": repeats,
                    "fill_s": round(fill_s, 1), "admin_calls_per_topics_page": calls_per_load,
                    "server": {"/topics": _server_loads(console.url + "/topics", repeats),
                               "/api/topics": _server_loads(console.url + "/api/topics", repeats)},
                    "chromium": _browser_loads(console.url + "/topics", repeats),
                }
    return results


def _range(summary: dict) -> str:
    return f"{summary['median']:,.1f} ({summary['min']:,.1f}-{summary['max']:,.1f})"


def _table(results: dict) -> str:
    rows = [("where", "what", "ms: median (min-max)")]
    for path, figures in results["server"].items():
        rows.append((f"server {path}", "app time (Server-Timing)", _range(figures["app_ms"])))
        rows.append((f"server {path}", f"HTTP exchange ({figures['body_bytes']:,} B)", _range(figures["http_ms"])))
    browser = results["chromium"]
    if "unavailable" in browser:
        rows.append(("chromium /topics", "not measured", browser["unavailable"]))
    else:
        rows.append(("chromium /topics", "request to response end", _range(browser["response_ms"])))
        rows.append(("chromium /topics", "DOMContentLoaded", _range(browser["dom_content_loaded_ms"])))
        rows.append(("chromium /topics", f"load ({browser['table_rows']:,} table rows)", _range(browser["load_ms"])))
    lines = [f"console topics page, {results['topics']:,} topics x {results['partitions_per_topic']} partition(s), "
             f"{results['repeats']} loads each after a warm-up"]
    lines += text_table(rows)
    lines.append("Admin calls per topics page: " + ", ".join(
        f"{name} x{count}" for name, count in sorted(results["admin_calls_per_topics_page"].items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.console_load", description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=1, help="partitions per topic")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    results = run(args.topics, args.partitions, args.repeats)
    print_results(results, _table(results), args.json_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
