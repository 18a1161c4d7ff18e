"""`policyc agent key|enroll|run|attest|facts`: the host agent and its attested TPM facts.

On each host, `key` makes the host's attestation key in its TPM (once; kept, wrapped by the
TPM, in the agent's state dir) and writes its public part. The operator then records that
key for the host with `enroll` (from the public file, carried over by hand or by the
provisioning system: this is the step that says "this key is host H's TPM"). `run` is the
agent itself: it publishes what it discovers of its host (interfaces, addresses: `facts`
prints them) and answers the control plane's challenges with TPM quotes, through the fleet
store (etcd); its addresses become the host's for the endpoint rules, so an instance of
another host cannot register an endpoint there. `attest` challenges a host now and prints
what was verified.

Once any host is enrolled, the fleet trusts a `tpm` claim only from an enrolled host whose
quote verified recently: RegisterInstance refuses the others (E732), and replicas do not
serve them. Exit codes: 0 ok; 1 the attestation or the key was refused; 2 usage, a bad
file, no TPM; 6 etcd could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from policyc.cluster.keys import DEFAULT_PREFIX

from .exit_codes import Exit
from .help import add_command

CODES = (Exit.OK, Exit.FAILED, Exit.USAGE, Exit.UNAVAILABLE)
TCTI_HELP = "the TPM, as tpm2-tools names it: device:/dev/tpmrm0, or swtpm:host=127.0.0.1,port=P for a software TPM"


def register(sub) -> None:  # type: ignore[no-untyped-def]
    p = add_command(sub, "agent", help="the host agent: attestation key, enrollment, challenges, attested TPM facts", codes=CODES,
                    description=__doc__, examples=[
                        "policyc agent key --tcti device:/dev/tpmrm0 --state-dir /var/lib/policyc-agent --out host-3.ak",
                        "policyc agent enroll --host host-3 --ak host-3.ak --etcd http://10.0.0.1:2379",
                        ("policyc agent run --host host-3 --tcti device:/dev/tpmrm0 --state-dir /var/lib/policyc-agent "
                         "--etcd http://10.0.0.1:2379"),
                        "policyc agent attest --host host-3 --etcd http://10.0.0.1:2379"])
    asub = p.add_subparsers(dest="agent_command", metavar="ACTION", parser_class=type(p))
    k = add_command(asub, "key", help="make (once) and print this host's attestation key", codes=CODES,
                    examples=["policyc agent key --tcti swtpm:host=127.0.0.1,port=2321 --state-dir agent/ --out ak.pub"])
    _tpm_flags(k, required=True)
    k.add_argument("--out", metavar="FILE", help="write the key's public part (TPM2B_PUBLIC) here, for `enroll`")
    k.set_defaults(func=_key)
    e = add_command(asub, "enroll", help="record a host's attestation key in the fleet (operator)", codes=CODES,
                    examples=["policyc agent enroll --host host-3 --ak host-3.ak --etcd http://127.0.0.1:2379"])
    e.add_argument("--host", required=True, help="the host, as the topology and registrations name it")
    e.add_argument("--ak", required=True, metavar="FILE", help="the public key file `policyc agent key --out` wrote")
    e.add_argument("--pcrs", default="sha256:0,1,2,3,4,5,6,7", help="the PCRs every quote must cover (default: firmware and boot)")
    _store_flags(e)
    e.set_defaults(func=_enroll)
    r = add_command(asub, "run", help="the agent: answer attestation challenges for this host until stopped", codes=CODES,
                    examples=[("policyc agent run --host host-3 --tcti device:/dev/tpmrm0 --state-dir /var/lib/policyc-agent "
                               "--etcd http://127.0.0.1:2379")])
    r.add_argument("--host", required=True, help="this host's name in the fleet")
    r.add_argument("--signal-period", type=float, default=0.2, metavar="SECONDS",
                   help="measure the host (interfaces, qdisc backlog, disks, model servers) and publish every SECONDS "
                        "(default 0.2; 0: do not measure)")
    r.add_argument("--sched-fifo", type=int, metavar="PRIO", help="run the collector SCHED_FIFO at this priority (1-99; root)")
    r.add_argument("--cpus", metavar="LIST", help="pin the collector to these CPUs (e.g. 0 or 2-3)")
    r.add_argument("--model-server", action="append", default=[], metavar="NAME=PID",
                   help="a model server process to measure (CPU, RSS, run-queue delay); repeatable")
    r.add_argument("--servers", type=Path, metavar="FILE",
                   help="model servers to start and supervise, each pinned to its plan's NUMA node and CPUs "
                        "(JSON list of {name, argv, numa_node, cpus?, env?}); a crashed one is started again")
    r.add_argument("--server-logs", type=Path, metavar="DIR", help="where the supervised servers' output goes (default: none)")
    r.add_argument("--session-store", action="append", default=[], metavar="NODE:KIND=DIR",
                   help="a session store on this host (e.g. 0:nvme=/mnt/nvme0/sessions): the agent times a session's state "
                        "written and read back there and publishes it; the placer uses it for that store; repeatable")
    r.add_argument("--session-interval", type=float, default=1.0, metavar="SECONDS",
                   help="how often each session store is probed (default 1)")
    r.add_argument("--lease-ttl", type=int, default=5, metavar="S",
                   help="the agent's lease (its facts and signals go this long after it stops answering; default 5)")
    r.add_argument("--uplinks", metavar="IF,…", help="this host's uplinks (default: its default routes' interfaces, else "
                                                    "those with a routable address)")
    _site_flags(r)
    r.add_argument("--no-hardware-facts", action="store_true",
                   help="report interfaces and addresses only (no GPUs, CUDA, NUMA, RDMA, NVMe, TPM/SEV-SNP/TDX, site)")
    _tpm_flags(r, required=False)
    _store_flags(r)
    r.set_defaults(func=_run)
    f = add_command(asub, "facts", help="print what the agent discovers of this host (interfaces, addresses, GPUs, "
                    "CUDA, NUMA, RDMA, NVMe, TPM/SEV-SNP/TDX, site), each with its source, as JSON",
                    codes=CODES, examples=["policyc agent facts --host host-3 --region us-west --zone us-west-2a"])
    f.add_argument("--host", required=True, help="this host's name in the fleet")
    _site_flags(f)
    f.set_defaults(func=_facts)
    a = add_command(asub, "attest", help="challenge a host's agent now and print what was verified", codes=CODES,
                    examples=["policyc agent attest --host host-3 --etcd http://127.0.0.1:2379"])
    a.add_argument("--host", required=True, help="the enrolled host to challenge")
    a.add_argument("--timeout", type=float, default=10.0, help="seconds the agent has to answer (default 10)")
    _store_flags(a)
    a.set_defaults(func=_attest)

    def usage(args: argparse.Namespace) -> int:
        p.print_help()
        return int(Exit.USAGE)
    p.set_defaults(func=usage)


def _site_flags(p: argparse.ArgumentParser) -> None:
    """The operator's site facts (in the config file: `region = "us-west"` in `[agent]`)."""
    p.add_argument("--region", help="this host's region (an operator fact; registrations on this host must claim it)")
    p.add_argument("--zone", help="this host's zone (an operator fact, reported)")
    p.add_argument("--hardware-firewall", choices=("true", "false"),
                   help="whether a hardware firewall guards this host (an operator fact; registrations must claim it)")


def _site(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from policyc.cluster.host_hardware import Site

    fw = None if args.hardware_firewall is None else args.hardware_firewall == "true"
    return Site(args.region or None, args.zone or None, fw)


def _tpm_flags(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument("--tcti", required=required, help=TCTI_HELP)
    p.add_argument("--state-dir", required=required, type=Path, help="where the agent keeps its key (wrapped by the TPM)")


def _store_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--etcd", nargs="+", required=True, metavar="URL", help="etcd endpoints of the fleet")
    p.add_argument("--etcd-prefix", default=DEFAULT_PREFIX, help=f"the fleet's key prefix (default {DEFAULT_PREFIX})")


def _fail(message: str, code: int = Exit.USAGE) -> int:
    print(f"policyc agent: error: {message}", file=sys.stderr)
    return int(code)


def _key(args: argparse.Namespace) -> int:
    from policyc.cluster.tpm import HostTpm, TpmError
    from policyc.cluster.tpm_quote import AttestationError, AttestationKey

    try:
        pub = HostTpm(args.tcti, args.state_dir).attestation_key()
        name = AttestationKey.parse(pub).name.hex()
        if args.out:
            Path(args.out).write_bytes(pub)
    except TpmError as e:
        return _fail(str(e))
    except AttestationError as e:
        return _fail(str(e), Exit.FAILED)
    except OSError as e:
        return _fail(f"{e.filename}: {e.strerror}")
    print(f"attestation key {name}" + (f" written to {args.out}" if args.out else ""))
    return 0


def _with_store(args: argparse.Namespace, body):  # type: ignore[no-untyped-def]
    """Run `body(store, keys)` against the fleet's etcd; (result, None) or (None, exit code)."""
    from policyc.cluster.etcd_store import EtcdStore
    from policyc.cluster.keys import Keys
    from policyc.cluster.store import StoreError

    try:
        store, keys = EtcdStore(args.etcd, op_timeout=3.0), Keys(args.etcd_prefix)
    except ValueError as e:
        return None, _fail(str(e))

    async def go():  # type: ignore[no-untyped-def]
        await store.connect()
        try:
            return await body(store, keys)
        finally:
            await store.close()
    try:
        return asyncio.run(go()), None
    except StoreError as e:
        return None, _fail(str(e), Exit.UNAVAILABLE)


def _enroll(args: argparse.Namespace) -> int:
    import getpass
    import socket

    from policyc.cluster.attestation import check_host, enroll
    from policyc.cluster.tpm_quote import AttestationError, parse_selection

    try:
        check_host(args.host)
        pcrs = parse_selection(args.pcrs)
        pub = Path(args.ak).read_bytes()
    except ValueError as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"{args.ak}: {e.strerror}")
    try:
        from policyc.cluster.tpm_quote import AttestationKey

        AttestationKey.parse(pub)
    except AttestationError as e:
        return _fail(f"{args.ak}: {e}", Exit.FAILED)
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    got, code = _with_store(args, lambda store, keys: enroll(store, keys, args.host, pub, pcrs=pcrs, by=who))
    if code is not None:
        return code
    print(f"enrolled host {args.host}: attestation key {got.key.name.hex()}, PCRs {args.pcrs}; from now on this fleet "
          "trusts `tpm` claims only from hosts whose quotes verify")
    return 0


def _attest(args: argparse.Namespace) -> int:
    from policyc.cluster.attestation import Attestor
    from policyc.cluster.tpm_quote import AttestationError

    async def body(store, keys):  # type: ignore[no-untyped-def]
        try:
            return await Attestor(store, keys, "policyc agent attest", timeout=args.timeout).attest(args.host)
        except AttestationError as e:
            return e
    got, code = _with_store(args, body)
    if code is not None:
        return code
    if isinstance(got, AttestationError):
        print(f"host {args.host}: attestation refused: {got}", file=sys.stderr)
        return int(Exit.FAILED)
    pcrs = ", ".join(f"{i}={v[:12]}…" for i, v in sorted(got.pcrs.items()))
    print(f"host {args.host}: attested with key {got.ak_name[:20]}…; PCRs {pcrs}")
    return 0


def _facts(args: argparse.Namespace) -> int:
    import json

    from .extras import require

    require("kernel", command="agent facts")  # interface discovery is pyroute2's
    from policyc.cluster.attestation import check_host
    from policyc.cluster.host_facts import discover

    try:
        facts = discover(check_host(args.host), _site(args), hardware=True)
    except (ValueError, OSError) as e:
        return _fail(str(e))
    print(json.dumps(facts.to_json(), indent=2))
    return 0


def _run(args: argparse.Namespace) -> int:
    from .extras import require

    require("kernel", command="agent run")  # interface discovery is pyroute2's
    from policyc.cluster.attestation import check_host
    from policyc.cluster.host_agent import HostAgent
    from policyc.cluster.server_pinning import PinError
    from policyc.cluster.server_specs import load_specs
    from policyc.cluster.session_probe import SessionStore
    from policyc.cluster.signal_ticker import IsolationError, parse_cpus
    from policyc.cluster.tpm import HostTpm, TpmError

    try:
        check_host(args.host)
        cpus = parse_cpus(args.cpus) if args.cpus else None
        servers = _servers(args.model_server)
        supervised = []
        if args.servers:  # an instance's facts left out are this host's (and one it contradicts is refused)
            from policyc.cluster.host_facts import discover

            here = None if args.no_hardware_facts else discover(args.host, _site(args), hardware=True)
            supervised = load_specs(args.servers, facts=here)
        stores = [SessionStore.parse(t) for t in args.session_store]
        if stores and not 0.05 <= args.session_interval <= 600:
            raise ValueError(f"--session-interval {args.session_interval:g}: between 0.05 and 600 s")
        ups = [u.strip() for u in args.uplinks.split(",") if u.strip()] if args.uplinks else None
        clash = set(servers) & {s.name for s in supervised}
        if clash:
            raise ValueError(f"--model-server and --servers both name {', '.join(sorted(clash))}")
        if args.signal_period and not 0.01 <= args.signal_period <= 60:
            raise ValueError(f"--signal-period {args.signal_period:g}: between 0.01 and 60 s (0: no signals)")
        if args.sched_fifo is not None and not 1 <= args.sched_fifo <= 99:
            raise ValueError(f"--sched-fifo {args.sched_fifo}: a SCHED_FIFO priority is 1..99")
        if not 2 <= args.lease_ttl <= 3600:
            raise ValueError(f"--lease-ttl {args.lease_ttl}: between 2 and 3600 s")
    except ValueError as e:
        return _fail(str(e))
    if (args.tcti is None) != (args.state_dir is None):
        return _fail("give --tcti and --state-dir together (or neither: an agent without a TPM)")
    tpm = HostTpm(args.tcti, args.state_dir) if args.tcti else None

    async def body(store, keys):  # type: ignore[no-untyped-def]
        agent = HostAgent(store, keys, args.host, tpm, ttl=args.lease_ttl, signal_period=args.signal_period or None, sched_fifo=args.sched_fifo,
                          cpus=cpus, processes=servers, servers=supervised, server_log_dir=args.server_logs,
                          session_stores=stores, session_interval=args.session_interval, uplinks=ups, site=_site(args),
                          hardware_facts=not args.no_hardware_facts)
        await agent.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # before saying ready: a SIGTERM after that line stops it cleanly
            loop.add_signal_handler(sig, stop.set)
        print(f"policyc agent: host {args.host} ready" + (f", attestation key {agent.ak_name[:20]}…" if tpm else ", no TPM"),
              flush=True)
        await stop.wait()
        await agent.stop()
        return 0
    try:
        _, code = _with_store(args, body)
    except (TpmError, IsolationError, PinError, ValueError) as e:  # ValueError: a session store directory not there
        return _fail(str(e))
    except OSError as e:  # a supervised server's command could not be started
        return _fail(f"--servers: {e}")
    return 0 if code is None else code


def _servers(specs: list[str]) -> dict[str, int]:
    """`--model-server NAME=PID` flags: ValueError naming the bad one."""
    out = {}
    for spec in specs:
        name, _, pid = spec.partition("=")
        if not name or not pid.isdigit() or int(pid) <= 0:
            raise ValueError(f"--model-server `{spec}`: NAME=PID expected (e.g. vllm-0=4242)")
        out[name] = int(pid)
    return out
