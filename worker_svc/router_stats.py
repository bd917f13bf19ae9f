"""Router statistics at the worker's /metrics: how many tokens each expert of each
mixture layer was routed, since the worker loaded its model.

A router that sends most tokens to a few experts wastes the mixture (those experts'
weights are read every step, the others' rarely) and is invisible in step times alone;
a rate over a window of `cbserve_worker_expert_tokens_total`, by layer and expert,
shows it: `rate(cbserve_worker_expert_tokens_total[5m])`.

The counts are kept by the model's ExpertMlp modules as plain Python integers (the
routing step has them as integers already), and read here only when Prometheus
scrapes: nothing is added to a step. A scrape may see a step half counted; a counter
never goes down.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from common.metrics import MODEL_NAME_LABEL

METRIC = "cbserve_worker_expert_tokens"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.experts$")


def expert_layers(model) -> list[tuple[int, object]]:
    """(layer index, ExpertMlp) of every mixture layer of a loaded model, in order."""
    found = []
    for name, module in model.named_modules():
        match = _LAYER.search(name)
        if match and hasattr(module, "tokens_per_expert"):
            found.append((int(match.group(1)), module))
    return sorted(found, key=lambda pair: pair[0])


class RouterStatsCollector(Collector):
    def __init__(self, model_name: str, layers: list[tuple[int, object]]) -> None:
        """layers: expert_layers(model), each mixture layer's index and ExpertMlp."""
        self._model_name = model_name
        self._layers = layers

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            METRIC,
            "Tokens routed to each expert of each mixture-of-experts layer (each token "
            "counts once for each of its top-k experts).",
            labels=(MODEL_NAME_LABEL, "layer", "expert"),
        )
        for layer, experts in self._layers:
            for expert, count in enumerate(list(experts.tokens_per_expert)):
                family.add_metric((self._model_name, str(layer), str(expert)), count)
        yield family
