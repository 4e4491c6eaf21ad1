"""`GET /metrics`: Prometheus text from one registry per server (prometheus_client), all kept in the server process
(the workers only compute), so no multiprocess mode is needed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


class Metrics:
    """The server's counters, gauges and histograms (names prefixed `vitlab_serve_`)."""

    def __init__(self, max_batch_size: int):
        disable_created_metrics()  # no `_created` twin per series: the server process is ours alone
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("vitlab_serve_requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "code"], registry=r)
        self.errors = Counter("vitlab_serve_errors", "Requests answered with an error, by kind (not_an_image, "
                              "body_too_large, overloaded, unauthorized, inference_failed, ...)", ["kind"], registry=r)
        self.images = Counter("vitlab_serve_images", "Images classified", registry=r)
        batch_buckets = sorted({1, 2, 4, 8, 16, 32, 64, 128, max_batch_size})
        self.batch_size = Histogram("vitlab_serve_batch_size", "Images per forward pass", registry=r,
                                    buckets=[b for b in batch_buckets if b <= max_batch_size])
        self.queue_depth = Gauge("vitlab_serve_queue_depth", "Images waiting for a worker", registry=r)
        self.in_flight = Gauge("vitlab_serve_requests_in_flight", "Requests admitted and not yet answered",
                               registry=r)
        self.latency = Histogram("vitlab_serve_request_latency_seconds", "Time from request to answer, by endpoint",
                                 ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r)
        self.inference = Histogram("vitlab_serve_batch_seconds", "Forward-pass time of one batch in a worker",
                                   buckets=_LATENCY_BUCKETS, registry=r)
        self.workers_ready = Gauge("vitlab_serve_workers_ready", "Workers ready to take a batch", registry=r)
        self.worker_restarts = Counter("vitlab_serve_worker_restarts", "Workers restarted after dying", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
