"""Word count: a keyed aggregation over a stream of lines, exactly once.

    python examples/word_count.py                       # embedded broker, sample text
    python examples/word_count.py --bootstrap 127.0.0.1:9092

Lines arrive on `lines`. One stage splits them into words and counts each word (a
stateful Spark aggregation, output mode update); every micro-batch writes the words whose
count changed to `word_counts`, keyed by word, through the exactly-once sink. The latest
record of a key is the word's count -- as a compacted topic would keep it. Lines are
produced in two rounds, each drained with `app.run(available_now=True)`, so the second
round's counts build on the state the first one left in the checkpoint.
"""
from __future__ import annotations

import argparse
import collections
import re
import tempfile

from _embedded import broker, ensure_topics

import eos

TEXT = """It was the best of times, it was the worst of times, it was the age of wisdom,
it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity,
it was the season of Light, it was the season of Darkness, it was the spring of hope,
it was the winter of despair."""


def produce_lines(bootstrap: str, lines: list[str]) -> None:
    with eos.Producer(bootstrap) as producer:
        producer.send_batch("lines", [line.encode() for line in lines]).result(60)


def build_app(bootstrap: str, checkpoint_dir: str) -> eos.App:
    from pyspark.sql import functions as F

    app = eos.App(bootstrap=bootstrap, checkpoint_dir=checkpoint_dir)

    @app.stage(source="lines", sink="word_counts", group="word-counter", output_mode="update")
    def count_words(lines):
        words = lines.select(F.explode(F.split(F.lower(F.col("value").cast("string")), r"[^a-z]+")).alias("word"))
        counts = words.where(F.col("word") != "").groupBy("word").count()
        return counts.select(F.col("word").alias("key"), F.col("count").cast("string").alias("value"))

    return app


def latest_counts(bootstrap: str) -> dict[str, int]:
    from spark_sink.readback import read_committed

    latest = {}
    for record in read_committed(bootstrap, "word_counts"):    # in offset order per partition
        latest[record.key.decode()] = int(record.value)
    return latest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", default=None, help="an eos broker (default: start an embedded one)")
    parser.add_argument("--repeat", type=int, default=200, help="how many times the text is sent per round")
    args = parser.parse_args()
    lines = [line.strip() for line in TEXT.splitlines()] * args.repeat
    expected = collections.Counter(w for line in lines for w in re.split(r"[^a-z]+", line.lower()) if w)
    with broker(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory(prefix="eos-checkpoints-") as checkpoints:
        ensure_topics(bootstrap, 2, "lines", "word_counts")
        app = build_app(bootstrap, checkpoints)
        for round_number in (1, 2):
            produce_lines(bootstrap, lines)
            app.run(available_now=True)
            counts = latest_counts(bootstrap)
            wanted = {w: n * round_number for w, n in expected.items()}
            top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:5]
            print(f"round {round_number}: {len(counts)} words; top: "
                  + ", ".join(f"{w}={n}" for w, n in top)
                  + ("  (exact)" if counts == wanted else "  (NOT exact)"), flush=True)
            if counts != wanted:
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
