"""The scheduler's metrics of KV that moves between workers (issue 46): transfers,
what they carried, how long they took, and the requests drained.

Observed as each move ends (workers/kv_moves.py) and each drain (workers/drain.py).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from common.metrics import MODEL_NAME_LABEL

# One transfer: a few blocks over loopback in milliseconds, a long sequence's
# thousands of blocks across hosts in seconds.
TRANSFER_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
OUTCOMES = ("moved", "failed")
# A rebalance's move (workers/rebalance.py), as kv_moves.MoveOutcome names it.
REBALANCE_OUTCOMES = ("moved", "recomputed", "requeued", "gone")


class KvTransferMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels = (MODEL_NAME_LABEL,)

        def counter(name: str, help_text: str):
            return Counter(name, help_text, labels, registry=registry).labels(model_name)

        self.blocks = counter(
            "cbserve_kv_transfer_blocks_total", "KV blocks moved from one worker to another."
        )
        self.bytes = counter(
            "cbserve_kv_transfer_bytes_total",
            "Bytes of KV moved from one worker to another, as the sending worker counts them.",
        )
        self.tokens = counter(
            "cbserve_kv_transfer_tokens_total",
            "Tokens whose KV moved to another worker instead of being computed again there.",
        )
        self.drained = counter(
            "cbserve_requests_drained_total",
            "Requests taken off a draining worker (cbserve drain, removal from discovery): "
            "moved with their KV, recomputed, or requeued before they ran.",
        )
        self.seconds = Histogram(
            "cbserve_kv_transfer_seconds",
            "One transfer of a request's KV, from the SendKv call to its answer.",
            labels,
            buckets=TRANSFER_BUCKETS,
            registry=registry,
        ).labels(model_name)
        self.transfers = Counter(
            "cbserve_kv_transfers_total",
            "Transfers of a request's KV by outcome: moved (the request went on with it), "
            "failed (it was recomputed instead).",
            (MODEL_NAME_LABEL, "outcome"),
            registry=registry,
        )
        # Known label values start at 0, so that rate() sees the first one.
        self._outcome = {
            outcome: self.transfers.labels(model_name, outcome) for outcome in OUTCOMES
        }
        self.rebalances = Counter(
            "cbserve_kv_rebalances_total",
            "Requests a worker with a full KV pool moved to another worker instead of "
            "preempting them, by outcome: moved (with their KV), recomputed (the transfer "
            "failed or no worker had room any more), gone (finished before they could move).",
            (MODEL_NAME_LABEL, "outcome"),
            registry=registry,
        )
        self._rebalanced = {
            outcome: self.rebalances.labels(model_name, outcome) for outcome in REBALANCE_OUTCOMES
        }

    def moved(self, num_blocks: int, num_bytes: int, num_tokens: int, seconds: float) -> None:
        self._outcome["moved"].inc()
        self.blocks.inc(num_blocks)
        self.bytes.inc(num_bytes)
        self.tokens.inc(num_tokens)
        self.seconds.observe(seconds)

    def failed(self, seconds: float) -> None:
        self._outcome["failed"].inc()
        self.seconds.observe(seconds)

    def rebalanced(self, outcome: str) -> None:
        self._rebalanced[outcome].inc()
