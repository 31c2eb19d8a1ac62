"""Prometheus metrics (prometheus_client, a registry of the daemon's own).  Label values are bounded:
endpoints come from the route table (anything else is "other"), statuses are HTTP codes."""

from __future__ import annotations

from collections.abc import Callable

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
CANCEL_REASONS = ("client_gone", "deadline", "shutdown")
CONNECTION_REFUSALS = ("too_many_connections", "header_timeout", "malformed", "send_stalled")


class Metrics:
    def __init__(self, endpoints: tuple[str, ...], queue_depth: Callable[[], int], slots_busy: Callable[[], int]):
        import prometheus_client
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        if hasattr(prometheus_client, "disable_created_metrics"):     # prometheus_client >= 0.18
            prometheus_client.disable_created_metrics()   # no *_created series: the process start time says as much

        self.endpoints = frozenset(endpoints)
        self.registry = r = CollectorRegistry(auto_describe=True)
        self._requests = Counter("edgeocr_requests", "Requests by endpoint and HTTP status.",
                                 ["endpoint", "status"], registry=r)
        self._latency = Histogram("edgeocr_request_seconds", "Request latency, seconds (OCR endpoints).",
                                  buckets=LATENCY_BUCKETS, registry=r)
        Gauge("edgeocr_queue_depth", "Requests waiting for the engine.", registry=r).set_function(queue_depth)
        Gauge("edgeocr_slots_busy", "Scheduler slots decoding a page now.", registry=r).set_function(slots_busy)
        self._generated = Counter("edgeocr_generated_tokens", "Tokens generated.", registry=r)
        self._prompt = Counter("edgeocr_prompt_tokens", "Prompt tokens processed.", registry=r)
        self._cancelled = Counter("edgeocr_cancelled", "Jobs stopped before their end, by reason.", ["reason"],
                                  registry=r)
        self._refused = Counter("edgeocr_connections_refused", "Connections closed by the HTTP layer, by reason.",
                                ["reason"], registry=r)
        for reason in CANCEL_REASONS:
            self._cancelled.labels(reason)
        for reason in CONNECTION_REFUSALS:
            self._refused.labels(reason)

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        ep = endpoint if endpoint in self.endpoints else "other"
        self._requests.labels(ep, str(status if 100 <= status <= 599 else 0)).inc()
        if ep in ("/v1/ocr", "/v1/chat/completions"):
            self._latency.observe(seconds)

    def tokens(self, generated: int, prompt: int) -> None:
        self._generated.inc(generated)
        self._prompt.inc(prompt)

    def cancelled(self, reason: str) -> None:
        self._cancelled.labels(reason if reason in CANCEL_REASONS else "shutdown").inc()

    def refused(self, reason: str) -> None:
        if reason in CONNECTION_REFUSALS:
            self._refused.labels(reason).inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
