"""The limits no hop of a placement may cross, and how much stability is worth.

One frozen object shared by the refresher (which prunes fabric paths once per tick) and
the placer (which checks the host-local hops per request), so both sides agree on what
"congested" means.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Thresholds:
    max_port_watermark: float = 0.80  # RDMA/NIC port buffer occupancy
    max_port_util: float = 0.90
    max_switch_watermark: float = 0.80
    max_link_util: float = 0.90
    max_pcie_util: float = 0.90
    min_health: float = 0.50
    stability_weight: float = 2.0  # rank by predicted + k * sigma: about the p97.5 latency
    budget_fraction: float = 1.0  # the share of the latency budget a plan may use

    def conservative(self) -> "Thresholds":
        """Tighter limits for placing on a stale snapshot: what we see may have moved."""
        return replace(
            self, max_port_watermark=min(self.max_port_watermark, 0.6), max_port_util=min(self.max_port_util, 0.7),
            max_pcie_util=min(self.max_pcie_util, 0.7), min_health=max(self.min_health, 0.8),
            stability_weight=max(self.stability_weight, 3.0), budget_fraction=min(self.budget_fraction, 0.85),
        )
