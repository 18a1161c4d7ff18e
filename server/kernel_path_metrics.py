"""What `policyc serve` shows of the kernel plane on the data path, on its Prometheus
endpoint: where it is attached (`policyc_data_path_info`: the interfaces, the gateway's
cgroup, value 1 while attached) and what its TC programs counted toward and from each
registered model server (`policyc_kernel_backend_*`, from the plane's per-backend maps, at
egress: on loopback every packet also passes ingress, which would count it twice).

Read at scrape time; nothing is kept here."""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .kernel_path import KernelPath


class KernelPathSeries(Collector):
    def __init__(self, kernel_path: Callable[[], KernelPath | None]) -> None:
        self._kernel_path = kernel_path  # the server's, while it has one

    def collect(self) -> Iterator[Metric]:
        kp = self._kernel_path()
        dp = kp.data_path if kp is not None else None
        info = GaugeMetricFamily("policyc_data_path_info", "The kernel plane on the data path (1 while attached)",
                                 labels=["interfaces", "cgroup"])
        if dp is not None and dp.cgroup is not None:
            info.add_metric([",".join(dp.config.interfaces), str(dp.cgroup)], 1)
        yield info
        payload = CounterMetricFamily("policyc_kernel_backend_payload_bytes", "TCP payload bytes TC counted, per "
                                      "registered model server and direction", labels=["backend", "direction"])
        packets = CounterMetricFamily("policyc_kernel_backend_packets", "Packets TC counted, per registered model "
                                      "server and direction", labels=["backend", "direction"])
        if kp is not None and dp is not None:
            plane = kp.guardian.plane
            for backend in sorted(dp.backends(), key=str):
                bid = kp.guardian.backend_id(backend)
                if bid is None:
                    continue
                for direction, toward in (("toward", True), ("from", False)):
                    c = plane.backend_counters(bid, "egress", toward)  # type: ignore[attr-defined]
                    payload.add_metric([str(backend), direction], c.payload)
                    packets.add_metric([str(backend), direction], c.packets)
        yield payload
        yield packets
