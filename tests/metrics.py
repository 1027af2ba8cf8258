"""Reading metrics as the tests need them: a broker's /metrics or a client's registry,
parsed with prometheus_client's own parser (never by string search), as
{(sample name, sorted labels): value}."""
from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def parse_exposition(text: str) -> tuple[set[str], dict[tuple[str, tuple], float]]:
    """(the families' names, every sample's value by (name, sorted label pairs))."""
    families: set[str] = set()
    samples: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return families, samples


def registry_samples(registry) -> dict[tuple[str, tuple], float]:
    """Every sample of a prometheus_client registry's exposition."""
    from prometheus_client import generate_latest
    return parse_exposition(generate_latest(registry).decode())[1]


class Scrape:
    """One scrape of an endpoint: the families' names and every sample's value."""

    def __init__(self, url: str):
        with urllib.request.urlopen(url, timeout=10) as response:
            self.families, self.samples = parse_exposition(response.read().decode())

    def value(self, name: str, default: float | None = None, **labels) -> float:
        """The sample's value. A sample the broker did not show raises KeyError unless a
        `default` is given (a labelled counter that never moved has no sample): a section of
        the scrape that failed must not pass for zeros."""
        key = (name, tuple(sorted(labels.items())))
        if key not in self.samples and default is not None:
            return default
        return self.samples[key]

    def total(self, name: str, **labels) -> float:
        """The sum over the samples of `name` whose labels include `labels`."""
        wanted = set(labels.items())
        return sum(value for (sample, sample_labels), value in self.samples.items()
                   if sample == name and wanted <= set(sample_labels))


def scrape(url: str) -> Scrape:
    return Scrape(url)
