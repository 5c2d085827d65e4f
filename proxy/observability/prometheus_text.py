"""Reading Prometheus text pages (a vLLM node's `/metrics`): the one parser in ppd.

Three readings of a page, for three needs:
- `sample_sums(text, names)`: the named metrics, each summed over its label sets (a node's
  engines). Lines are found with str.find: vLLM's page holds hundreds of histogram lines
  that the scraper never needs, and prometheus-client's full parse of a 580-line vLLM 0.32
  page costs ~140x more (7.5 ms against 55 us), every second, per node, on the proxy's
  event loop.
- `sample_sums(text)`: every sample line of the page, line by line (calibration, probes).
- `families(text)`: the whole page as prometheus-client's metric families, HELP and TYPE
  included, for a page that is exposed again (`proxy.observability.worker_metrics`).
`label_ints` reads integer labels of a metric's lines (`vllm:cache_config_info` carries
the KV capacity in its labels). A sample value that is not a number is a ValueError.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


def sample_sums(text: str, names: Iterable[str] | None = None) -> dict[str, float]:
    """{metric name: its sample values summed over label sets}: only `names` (absent from
    the result when the page lacks them), or every sample on the page when None."""
    if names is None:
        return _every_sum(text)
    totals: dict[str, float] = {}
    page = "\n" + text
    for name in names:
        key = "\n" + name
        pos = page.find(key)
        while pos >= 0:
            end = page.find("\n", pos + 1)
            line = page[pos + len(key):end if end >= 0 else len(page)]
            pos = page.find(key, pos + 1)
            if line[:1] == "{":
                line = line.rpartition("}")[2]  # after the labels (a value may hold "}")
            elif line[:1] not in (" ", "\t"):
                continue  # another metric whose name starts with this one
            fields = line.split()
            if fields:
                totals[name] = totals.get(name, 0.0) + _number(fields[0], name)
    return totals


def _every_sum(text: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            name, rest = line[:brace], line.rpartition("}")[2]
        else:
            name, _, rest = line.partition(" ") if " " in line else line.partition("\t")
        fields = rest.split()
        if name and fields:
            totals[name] = totals.get(name, 0.0) + _number(fields[0], name)
    return totals


def _number(value: str, name: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"metric {name}: sample value {value!r} is not a number") from None


def label_ints(text: str, name: str, *labels: str) -> dict[str, list[int]]:
    """Per label: its integer values on the labelled sample lines of metric `name`, in page
    order (a line without it, or with a value that is not an integer, adds nothing)."""
    values: dict[str, list[int]] = {label: [] for label in labels}
    page = "\n" + text
    key = "\n" + name + "{"
    pos = page.find(key)
    while pos >= 0:
        end = page.find("\n", pos + 1)
        line = page[pos:end if end >= 0 else len(page)]
        for label in labels:
            start = line.find(f'{label}="')
            if start >= 0:
                start += len(label) + 2
                value = line[start:line.find('"', start)]
                if value.isdigit():
                    values[label].append(int(value))
        pos = page.find(key, pos + 1)
    return values


def families(text: str) -> Iterable[Metric]:
    """The page's metric families, parsed in full by prometheus-client."""
    return text_string_to_metric_families(text)
