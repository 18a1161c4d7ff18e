"""The hardware self-heal steps as they really run (the executor's execute mode).

- RDMA link refresh: the port's network device is taken down, brought back up, and the
  step waits for carrier (the link is only refreshed once it carries again). An RDMA port
  `mlx5_0/1` names its device through `/sys/class/infiniband/mlx5_0/device/net/`; a plain
  device name is used as it is (the tests' dummy links in a netns).
- GPU reset: `nvidia-smi --gpu-reset -i N`, refused where this host has no NVIDIA GPU
  (no `/dev/nvidia<N>`), saying so: resetting what is not there is never "done".
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


class HealStepError(RuntimeError):
    """A step that could not be taken; the message says where and why."""


@dataclass(frozen=True, slots=True)
class LinkRefresh:
    device: str
    down_s: float  # how long the link stayed down
    carrier_after_s: float  # from `up` to carrier


def netdev_of(rdma_link: str, sys_root: str = "/sys") -> str:
    """The network device behind an RDMA port (`mlx5_0/1`), or the name itself."""
    dev = rdma_link.split("/", 1)[0]
    net = Path(sys_root) / "class" / "infiniband" / dev / "device" / "net"
    if net.is_dir():
        found = sorted(p.name for p in net.iterdir())
        if found:
            return found[0]
    return dev


def refresh_link(rdma_link: str, netns: str | None = None, *, carrier_timeout: float = 10.0, down_for: float = 0.05) -> LinkRefresh:
    """Down, then up, then wait for carrier. Raises HealStepError naming the device."""
    from pyroute2 import IPRoute

    device = netdev_of(rdma_link)
    where = f"{device}{f' in netns {netns}' if netns else ''}"
    try:
        with IPRoute(netns=netns) if netns else IPRoute() as ipr:
            found = ipr.link_lookup(ifname=device)
            if not found:
                raise HealStepError(f"link refresh: no device `{where}`")
            idx = found[0]
            ipr.link("set", index=idx, state="down")
            t_down = time.monotonic()
            time.sleep(down_for)
            ipr.link("set", index=idx, state="up")
            t_up = time.monotonic()
            deadline = t_up + carrier_timeout
            while True:
                link = ipr.get_links(idx)[0]
                if link.get_attr("IFLA_CARRIER") == 1 and link.get_attr("IFLA_OPERSTATE") in ("UP", "UNKNOWN"):
                    return LinkRefresh(device, t_up - t_down, time.monotonic() - t_up)
                if time.monotonic() >= deadline:
                    raise HealStepError(f"link refresh: `{where}` is up but has no carrier after {carrier_timeout:g} s")
                time.sleep(0.01)
    except HealStepError:
        raise
    except Exception as e:  # pyroute2's NetlinkError and namespace errors
        raise HealStepError(f"link refresh of `{where}`: {e}") from e


def gpu_present(index: str, dev_root: str = "/dev") -> str | None:
    """None when GPU `index` is there to reset; otherwise why not."""
    if not index.isdigit():
        return f"GPU index `{index}` is not a number"
    if not os.path.exists(os.path.join(dev_root, f"nvidia{index}")):
        return f"no NVIDIA GPU {index} on this host (no {dev_root}/nvidia{index}): a GPU reset needs real hardware"
    return None
