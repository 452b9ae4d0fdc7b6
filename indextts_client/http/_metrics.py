"""The Prometheus metrics of ``GET /metrics``."""

from __future__ import annotations

import prometheus_client

__all__ = ["Metrics"]


class Metrics:
    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.requests = prometheus_client.Counter(
            "indextts_requests", "Speech requests by outcome", ["outcome"], registry=self.registry
        )
        self.latency = prometheus_client.Histogram(
            "indextts_request_seconds", "Whole request time", registry=self.registry
        )
        self.first_audio = prometheus_client.Histogram(
            "indextts_first_audio_seconds", "Time to the first audio bytes", registry=self.registry
        )
        self.queue_depth = prometheus_client.Gauge(
            "indextts_queue_depth", "Requests in flight per member", ["member"], registry=self.registry
        )
        self.restarts = prometheus_client.Gauge(
            "indextts_restarts", "Sidecar restarts per member", ["member"], registry=self.registry
        )
