"""The reference reading of a metrics page: prometheus_client's own exposition parser, then
the table's series picked and combined in plain Python. The fast reader
(`placer.metrics_text`) must give the same figures on every page the tests see."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from policyc.placer.server_metric_names import Agg, MetricMap


def reference_figures(body: bytes, metric_map: MetricMap) -> dict[str, float]:
    samples = [s for fam in text_string_to_metric_families(body.decode()) for s in fam.samples]
    out: dict[str, float] = {}
    for key, series in metric_map.items():
        got = []
        for s in samples:
            if s.name != series.name or any(s.labels.get(k) != v for k, v in series.labels):
                continue
            v = float(s.labels[series.value_label]) if series.value_label else float(s.value)
            if math.isfinite(v):
                got.append(v)
        if got:
            out[key] = sum(got) if series.agg is Agg.SUM else max(got)
    return out
