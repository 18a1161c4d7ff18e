"""What `policyc instance register` and its JSON Lines path share: the deployment facts a
registration names, one call to the service with the command's exit codes, and the facts
filled from the service's own topology (`ListHosts`)."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from .connection import SetupError, connect, fail, usage

FACTS = ("host", "gpu", "gpu_model", "region", "session_state", "cuda", "endpoint")
# what each fact is (`policyc topology hosts --gpus` lists the values the service's topology holds)
FACT_HELP = {
    "host": "the host it runs on (a name `policyc topology hosts` lists)",
    "gpu": "its GPU on that host (`gpu0`, ...)",
    "gpu_model": "the GPU's class (`H100`, `A100`, ...: the topology's)",
    "region": "the host's region",
    "session_state": "the session store on the GPU's NUMA node (`local`, `remote`, ...)",
    "cuda": "the host's CUDA version",
    "endpoint": "IP:PORT a gateway sends this instance's traffic to (an address of its host); none: placement only",
}
FLAGS = ("tpm", "memory_encryption", "hardware_firewall", "tee")


class Refused(Exception):
    """The call did not happen or was refused: `code` is the command's exit code (already reported)."""

    def __init__(self, code: int) -> None:
        self.code = code


def call_service(args: argparse.Namespace, command: str, call: Callable[[Any], Any]) -> Any:
    """Connect as the connection flags say and make one call; a connection that cannot be
    set up is a usage error, a refusal or an unreachable service the client's exit code."""
    from policyc.client import ClientError

    try:
        client = connect(args)
    except SetupError as e:
        raise Refused(usage(command, str(e))) from None
    with client:
        try:
            return call(client)
        except ClientError as e:
            raise Refused(fail(command, args, e)) from None


def fill_from_topology(client: Any, msg: Any, numa_given: bool) -> str | None:
    """The facts of `msg`'s host and GPU that neither a flag nor --file gave, taken from the
    service's own topology (`ListHosts`): the service checks every claimed fact against it,
    so a registration names its host, GPU and endpoint, and the rest is what the host is.
    Returns why the registration cannot be sent (a host or GPU the topology does not know)."""
    d = msg.deployment
    if not d.host:
        return None
    hosts = client.list_hosts()
    if not hosts.known:
        return None
    h = next((x for x in hosts.hosts if x.host == d.host), None)
    if h is None:
        near = [x.host for x in hosts.hosts][:3]
        return (f"--host `{d.host}`: no such host among the service's {len(hosts.hosts)} "
                f"({', '.join(near)}, …: `policyc topology hosts` lists them)")
    if not d.region:
        d.region = h.region
    if not d.cuda:
        d.cuda = h.cuda
    for flag in FLAGS:
        if not getattr(d, flag):
            setattr(d, flag, getattr(h, flag))
    g = next((x for x in h.gpus if x.gpu == d.gpu), None)
    if g is None:
        return f"--gpu `{d.gpu}`: {d.host} has {', '.join(x.gpu for x in h.gpus) or 'no GPU'}"
    if not d.gpu_model:
        d.gpu_model = g.gpu_model
    if not d.session_state:
        d.session_state = g.session_state
    if not numa_given and d.numa_node == 0:
        d.numa_node = g.numa_node
    return None
