"""`policyc serve --bundle bundle.json`: the gRPC decision service.

Starts on the embedded simulated cluster unless `--telemetry local` is given. SIGHUP
reloads the bundle file atomically (as does the `ReloadBundle` RPC); SIGINT/SIGTERM stop
cleanly (health goes NOT_SERVING, in-flight RPCs finish, the audit log is flushed).
Exit codes: 0 stopped cleanly; 1 stopped, but the audit log did not close cleanly (its
writer died or a record could not be stored: the counts of lost records are printed); 2 bad
configuration (bundle, TLS files, address, audit log or key; with `--enforcer kernel`, a kernel
plane that cannot load or be put on the data path), one line.

With the kernel plane loaded (`--enforcer kernel`, or `auto` where root and BPF allow) the
service puts it on the data path: its TC programs on `--data-path-interface` (default lo),
its connect hooks on the gateway's cgroup (`--gateway-cgroup`, or one it makes and prints),
its backend map following the registry. Under `auto` a failure to attach is a warning, and
the plane stays loaded but attached to nothing. Stop detaches everything.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys
from pathlib import Path

from policyc.server import event_loop


def register(sub) -> None:  # type: ignore[no-untyped-def]
    from .exit_codes import Exit
    from .help import add_command
    from .listen_address import listen_host

    p = add_command(sub, "serve", help="run the gRPC decision service", description=__doc__,
                    codes=(Exit.OK, Exit.FAILED, Exit.USAGE),
                    examples=["policyc serve --bundle bundle.json --port 50051",
                              ("policyc serve --bundle bundle.json --token operator:$OPS_TOKEN --token client:$APP_TOKEN "
                               "--tls-cert srv.pem --tls-key srv.key --host 0.0.0.0"),
                              "policyc serve --bundle bundle.json --metrics-address 127.0.0.1:9464 --audit-log audit.db"])
    p.add_argument("--bundle", required=True, help="compiled bundle (policyc compile … -o bundle.json; `-`: stdin, not reloadable by SIGHUP)")
    p.add_argument("--public-key", help="ed25519 public key (PEM): the bundle must be signed by it")
    p.add_argument("--host", type=listen_host, default="127.0.0.1",
                   help="listen address: an IP address or localhost (default loopback)")
    p.add_argument("--port", type=_port, default=50051, help="listen port (0: ephemeral; default 50051)")
    p.add_argument("--telemetry", choices=("simulated", "local"), default="simulated",
                   help="topology source: the embedded simulated cluster (default) or this machine")
    p.add_argument("--sim-seed", type=int, default=1, help="simulated cluster: random seed (default 1)")
    p.add_argument("--sim-hosts", type=_bounded(int, 1, 4096), default=32, help="simulated cluster: hosts (default 32)")
    p.add_argument("--sim-gpus-per-host", type=_bounded(int, 1, 64), default=4, help="simulated cluster: GPUs per host (default 4)")
    p.add_argument("--refresh", type=_bounded(float, 0.01, 3600.0), default=0.2, help="topology refresh interval, seconds")
    p.add_argument("--enforcer", choices=("auto", "kernel", "userspace", "off"), default="auto",
                   help="circuit-break enforcement: the eBPF kernel plane where root and BPF allow (auto), "
                        "required (kernel), user space only, or off")
    p.add_argument("--data-path-interface", action="append", default=[], metavar="IF",
                   help="with the kernel plane loaded: attach its TC programs (per-backend counters, the HTTP/2 "
                        "walker) to this interface; repeatable (default: lo, the demo's data plane)")
    p.add_argument("--gateway-cgroup", metavar="PATH",
                   help="with the kernel plane loaded: the cgroup v2 directory the gateway's Envoy runs in, for the "
                        "connect hooks that send a quarantined model server's new connections to its backup "
                        "(default: one made under the cgroup2 mount, printed at start, removed at stop)")
    p.add_argument("--self-heal", choices=("dry-run", "execute"), default="dry-run",
                   help="self-heal's GPU reset, RDMA link refresh and rebalance: recorded only (dry-run, the default) "
                        "or executed (execute: an operator's explicit switch, audited)")
    p.add_argument("--metrics-port", type=_port, help="serve Prometheus metrics on this port (on --host)")
    p.add_argument("--metrics-address", metavar="HOST:PORT", help="serve Prometheus metrics on this address instead")
    p.add_argument("--ready-min-instances", type=int, default=0, metavar="N",
                   help="readiness: report NOT_SERVING until N instances are registered (default 0)")
    from policyc.cluster.serve_flags import add_fleet_flags
    from policyc.server.security_flags import add_security_flags

    add_security_flags(p)  # --token, --open-fleet, TLS, the audit log: the same for `serve` and `gateway`
    add_fleet_flags(p)  # --etcd URL…, --state-dir: many replicas, or a registry that survives a restart
    from policyc.cli.scrape_flags import add_scrape_flags

    add_scrape_flags(p)  # --scrape-interval, --no-scrape: the model servers' own metrics to the placer
    p.set_defaults(func=run)


def _bounded(kind: type, lo: float, hi: float):  # type: ignore[no-untyped-def]
    """An argparse type: a number of `kind` within [lo, hi] (a simulated cluster of 10⁹
    hosts, or a refresh every 0 s, is a mistake to refuse with one line, not to try)."""
    def parse(text: str):  # type: ignore[no-untyped-def]
        try:
            if not text.isascii():  # int() and float() also read full-width and other scripts' digits
                raise ValueError
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"`{ascii(text[:32])[1:-1]}` is not a {'whole ' if kind is int else ''}number") from None
        if not lo <= value <= hi:  # NaN too
            raise argparse.ArgumentTypeError(f"{text[:32]} is out of range ({lo:g} to {hi:g})")
        return value
    parse.__name__ = kind.__name__
    return parse


def _port(text: str) -> int:
    """A TCP port, 0 to 65535 (an out-of-range port once listened on another one silently)."""
    if not text.isascii() or not text.lstrip("-").isdigit():  # int() also reads `５０` as 50
        raise argparse.ArgumentTypeError(f"`{ascii(text[:32])[1:-1]}` is not a port number")
    n = int(text, 10)
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"port {n} is out of range (0 to 65535)")
    return n


def check_private_key(path: str) -> None:
    """An audit signing key that cannot be read is a usage error before anything starts."""
    from policyc.cli.keys import KeyError_, load_private

    try:
        load_private(path)
    except KeyError_ as e:
        raise ValueError(str(e)) from None


def fleet_access(server) -> str:  # type: ignore[no-untyped-def]
    """The ready line's word on who may change the fleet (and where the operator token is)."""
    if server.config.open_fleet:
        return "fleet OPEN to every caller (--open-fleet)"
    op = server.operator
    if op is None or op.path is None:
        return "fleet changes need an operator token (--token)"
    return f"operator token in {op.path} (`policyc instance`/`reload` on this machine read it)"


def _fail(msg: str) -> int:
    print(f"policyc serve: error: {msg}", file=sys.stderr)
    return 2


def _data_path(args):  # type: ignore[no-untyped-def]
    """The kernel plane's place on the data path from the flags (ValueError: a flag that
    cannot work, one line)."""
    from policyc.enforcer.data_path import DataPathConfig

    given = bool(args.data_path_interface or args.gateway_cgroup)
    if given and args.enforcer in ("userspace", "off"):
        raise ValueError(f"--data-path-interface and --gateway-cgroup place the kernel plane: "
                         f"they need --enforcer kernel or auto, not {args.enforcer}")
    cgroup = None
    if args.gateway_cgroup:
        cgroup = Path(args.gateway_cgroup)
        if not (cgroup / "cgroup.procs").is_file():
            raise ValueError(f"--gateway-cgroup {args.gateway_cgroup}: not a cgroup v2 directory (no cgroup.procs in it)")
    for name in args.data_path_interface:
        if not name or len(name) > 15 or "/" in name or not name.isprintable() or name.isspace():
            raise ValueError(f"--data-path-interface `{ascii(name[:32])[1:-1]}` is not an interface name")
    return DataPathConfig(tuple(dict.fromkeys(args.data_path_interface)) or ("lo",), cgroup)


def register_hint(telemetry: str, port: int) -> str:
    """What a fresh service says while no instance is registered: every Decide is refused
    until one is, and nothing else tells a new user how."""
    server = "" if port == 50051 else f" --server 127.0.0.1:{port}"
    where = ("the simulated cluster's hosts are host-0000, host-0001, …; `policyc init DIR` writes instances "
             "admitted on them to DIR/fleet/") if telemetry == "simulated" else "give each instance its host's facts"
    return (f"no instances are registered yet, so every request is refused: register some with "
            f"`policyc instance register{server} --file INSTANCE.json` or its flags (`policyc instance register --help`); {where}")


def run(args) -> int:
    from policyc.compiler import bundle_io
    from policyc.server.app import DecisionServer
    from policyc.server.config import ClusterSpec, EnforcerMode, SelfHeal, ServeConfig, Telemetry
    from policyc.server.security_flags import security_config
    from policyc.audit.errors import AuditError
    from policyc.server.transport import TransportError

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        from policyc.cli.keys import KeyError_, load_public

        try:
            key = load_public(args.public_key) if args.public_key else None
        except KeyError_ as e:
            return _fail(str(e))
        security = security_config(args, check_private_key)
        bundle = bundle_io.loads(sys.stdin.read(), origin="<stdin>", public_key=key) if args.bundle == "-" \
            else bundle_io.load(args.bundle, public_key=key)
    except (bundle_io.BundleError, ValueError) as e:
        return _fail(str(e))
    metrics_host, metrics_port = None, args.metrics_port
    if args.metrics_address:
        host, sep, port_text = args.metrics_address.rpartition(":")
        if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
            return _fail(f"--metrics-address `{args.metrics_address}`: expected HOST:PORT")
        metrics_host, metrics_port = host.strip("[]"), int(port_text)
    tls = security["tls"]
    from policyc.cli.scrape_flags import scrape_budget, scrape_interval

    cfg = ServeConfig(
        host=args.host, port=args.port, telemetry=Telemetry(args.telemetry),
        cluster=ClusterSpec(seed=args.sim_seed, hosts=args.sim_hosts, gpus_per_host=args.sim_gpus_per_host),
        refresh_interval=args.refresh, metrics_scrape_interval=scrape_interval(args), metrics_scrape_budget=scrape_budget(args), enforcer=EnforcerMode(args.enforcer), self_heal=SelfHeal(args.self_heal),
        metrics_port=metrics_port, metrics_host=metrics_host, ready_min_instances=args.ready_min_instances, settle_heap=True, bundle_key=key,
    )
    from policyc.cluster.serve_flags import fleet_config, token_dir

    try:
        fleet = fleet_config(args, key)
        cfg = dataclasses.replace(cfg, fleet=fleet, data_path=_data_path(args), token_dir=token_dir(args, fleet, args.port),
                                  **security)
    except ValueError as e:
        return _fail(str(e))

    from policyc.cluster.store import StoreError

    async def main() -> int:
        try:
            server = DecisionServer(bundle, cfg)
            port = await server.start()
        except (TransportError, OSError, ValueError, RuntimeError, AuditError, StoreError) as e:
            return _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def reload() -> None:
            if args.bundle == "-":
                print("policyc serve: SIGHUP: the bundle came from stdin, there is no file to reload "
                      "(use `policyc reload FILE`)", file=sys.stderr)
                return
            async def go() -> None:
                try:
                    if server.replica is not None and cfg.fleet is not None and cfg.fleet.shared:
                        # a replica: SIGHUP rolls the file out to the whole cluster (compare-and-swap)
                        b = await asyncio.to_thread(server.service.verifier.load_path, args.bundle)
                        out = await asyncio.to_thread(server.replica.roll_out, b)
                        print(f"rolled out {args.bundle}: {out.previous[:19]}… → {out.current[:19]}… (every replica "
                              "verifies it before it swaps)", file=sys.stderr)
                        return
                    prev, evicted = await server.reload_path(args.bundle)
                    print(f"reloaded {args.bundle}: {prev[:19]}… → {server.state.bundle_hash[:19]}…"
                          + (f" ({len(evicted)} evicted)" if evicted else ""), file=sys.stderr)
                except Exception as e:  # a bad file keeps the old bundle serving; say why
                    print(f"policyc serve: reload refused, still serving {server.state.bundle_hash[:19]}…: {e}", file=sys.stderr)
            loop.create_task(go())

        loop.add_signal_handler(signal.SIGHUP, reload)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        if server.kernel_path is not None:
            cg = server.kernel_path.data_path.cgroup
            print(f"policyc serve: kernel plane on the data path: {server.kernel_path.describe()} "
                  f"(run the gateway's Envoy in it: echo PID > {cg}/cgroup.procs)", file=sys.stderr, flush=True)
        print(f"policyc serve: listening on {cfg.host}:{port} ({'TLS' if tls else 'plaintext'}), bundle "
              f"{bundle.content_hash[:23]}…, telemetry {cfg.telemetry.value}; {fleet_access(server)}", file=sys.stderr, flush=True)
        if not len(server.engine.state.registry):
            print(f"policyc serve: {register_hint(cfg.telemetry.value, port)}", file=sys.stderr, flush=True)
        await stop.wait()
        await server.stop(grace=2.0)
        from policyc.cli.audit_exit import audit_loss

        lost = audit_loss(server.audit)
        if lost is not None:
            print(f"policyc serve: {lost}", file=sys.stderr)
            return 1  # Exit.FAILED
        print("policyc serve: stopped", file=sys.stderr)
        return 0

    return event_loop.run(main())
