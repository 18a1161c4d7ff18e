"""The audit log's Prometheus metrics, read at scrape time from the bridge and the log.

- `policyc_audit_healthy`: 1 while the gate admits decisions, 0 while Decide refuses them
  because the log cannot keep them (the writer is gone, a record was not stored, it is
  behind its window);
- `policyc_audit_records_written_total`: records made durable since the log was opened;
- `policyc_audit_records_lost_total`: records handed to the log that were never made
  durable (0 unless something failed; in sync mode none of them had been acknowledged);
- `policyc_audit_acknowledged_lost_total`: decisions acknowledged to a client whose record
  was never confirmed durable (group mode only; always 0 in sync mode; an upper bound: a
  writer killed between a commit and its acknowledgement may have stored that batch);
- `policyc_audit_queue_depth`: records handed over and not yet durable;
- `policyc_audit_commit_seconds`: the writer's commit times (insert and fsync), a histogram.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .audit_bridge import AuditBridge


class AuditCollector(Collector):
    def __init__(self, bridge: AuditBridge) -> None:
        self.bridge = bridge

    def collect(self) -> Iterator[Metric]:
        b, log = self.bridge, self.bridge.log
        yield GaugeMetricFamily("policyc_audit_healthy", "1 while the audit log admits decisions, 0 while Decide refuses them",
                                value=0.0 if b.refusal() is not None else 1.0)
        yield CounterMetricFamily("policyc_audit_records_written", "Audit records made durable since the log was opened",
                                  value=float(log.stored))
        yield CounterMetricFamily("policyc_audit_records_lost", "Audit records handed over but never confirmed durable",
                                  value=float(b.lost))
        yield CounterMetricFamily("policyc_audit_acknowledged_lost",
                                  "Decisions acknowledged whose audit record was never made durable (group mode)",
                                  value=float(b.acknowledged_lost))
        yield GaugeMetricFamily("policyc_audit_queue_depth", "Audit records handed over and not yet durable",
                                value=float(max(0, log.submitted - log.acked) + len(b._pending)))
        times = log.commit_seconds
        buckets, running = [], 0
        for bound, n in zip((*times.BOUNDS, float("inf")), times.counts):
            running += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        yield HistogramMetricFamily("policyc_audit_commit_seconds", "The audit writer's commit times (insert and fsync)",
                                    buckets=buckets, sum_value=times.total)
