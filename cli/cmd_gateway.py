"""`policyc gateway --bundle bundle.json`: the decision service, its endpoint picker and an
Envoy in front of the registered pool, in one command.

Register model servers with `RegisterInstance` (with `deployment.endpoint`, their gRPC
`ip:port`) on the decision API; Envoy's pool follows the registry (file-based EDS). Clients
send their requests (gRPC or HTTP) to `--listen`.

`--print-bootstrap` prints the Envoy bootstrap instead, for users who run their own Envoy:
point it at a running picker (`--picker`) and give the pool (`--endpoint`, repeatable) or
the EDS file it should watch (`--eds-path`).

Without `--etcd`, the registry is kept in the state dir (`--state-dir`, as `policyc serve`
keeps it) and the gateway's files (bootstrap, pool, Envoy's log and pid file) in its
`gateway/` folder: a restart, after a crash or a `kill -9` too, comes back with the fleet it
had. Envoy dies with the gateway (the parent-death signal); a start stops a leftover Envoy
its pid file names, and a port someone else holds is named in the error.

Exit codes: 0 stopped cleanly; 1 stopped, but the audit log did not close cleanly (its
writer died or a record could not be stored: the counts of lost records are printed); 2 bad
configuration (bundle, addresses, Envoy missing or refusing its configuration, a port in
use), one line.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import signal
import sys
import threading
from pathlib import Path


def register(sub) -> None:  # type: ignore[no-untyped-def]
    from .exit_codes import Exit
    from .help import add_command

    p = add_command(sub, "gateway", help="run Envoy with policyc as its endpoint picker (or print its bootstrap)",
                    description=__doc__, codes=(Exit.OK, Exit.FAILED, Exit.USAGE),
                    examples=["policyc gateway --bundle bundle.json --listen 127.0.0.1:8080",
                              "policyc gateway --print-bootstrap --picker 127.0.0.1:9002 --endpoint 10.0.0.5:8081 > envoy.json"])
    p.add_argument("--bundle", help="compiled bundle (policyc compile … -o bundle.json); required unless --print-bootstrap")
    p.add_argument("--listen", default="127.0.0.1:8080", help="where clients connect to Envoy (default 127.0.0.1:8080)")
    p.add_argument("--admin", default="127.0.0.1:9901", help="Envoy's admin address (default 127.0.0.1:9901)")
    p.add_argument("--port", type=int, default=50051, help="the decision API's port, for RegisterInstance (default 50051)")
    p.add_argument("--picker-port", type=int, default=9002, help="the endpoint picker's port (ext_proc; default 9002)")
    p.add_argument("--failure-mode-allow", action="store_true",
                   help="when the picker is unreachable let Envoy round-robin over the pool (default: refuse with 503)")
    p.add_argument("--max-in-flight", type=int, default=512, help="requests between pick and answer before 429 (default 512)")
    p.add_argument("--concurrency", type=int, default=1, help="Envoy worker threads (default 1)")
    p.add_argument("--public-key", help="ed25519 public key (PEM): the bundle, and every reload, must be signed by it")
    p.add_argument("--telemetry", choices=("simulated", "local"), default="simulated",
                   help="GPU telemetry: the embedded simulated cluster (default) or this machine's (/sys, NVML), "
                        "whose SM utilisation then joins the gateway's timings in the correlation rules")
    p.add_argument("--self-heal", choices=("dry-run", "execute"), default="dry-run",
                   help="self-heal's GPU reset, RDMA link refresh and rebalance: recorded only (dry-run, the default) "
                        "or executed (execute: an operator's explicit switch, audited)")
    p.add_argument("--enforcer", choices=("auto", "kernel", "userspace", "off"), default="userspace",
                   help="circuit-break enforcement: eBPF kernel plane (kernel, or auto where root and BPF allow), user space (default), or off")
    p.add_argument("--workdir", help="where the bootstrap, the pool file, Envoy's log and pid file go (default: `gateway/` "
                                     "in the state dir, else a temp dir)")
    p.add_argument("--tokenizer", action="append", default=[], metavar="MODEL=PATH",
                   help="count MODEL's prompt tokens with this tokenizer.json (or the model folder holding one); "
                        "repeatable. A model without one gets a declared estimate, labelled as such")
    p.add_argument("--no-llm", action="store_true",
                   help="no LLM routes (OpenAI bodies read, HTTP/1.1 upstreams, streams supervised): gRPC and REST as before")
    p.add_argument("--otlp-endpoint", metavar="IP:PORT",
                   help="trace every request: Envoy's spans (W3C traceparent continued from the client) and the "
                        "picker's (parse, match, place, audit) to this OTLP/gRPC collector (needs policyc[otel])")
    p.add_argument("--otlp-sampling", metavar="PERCENT", type=float, default=100.0,
                   help="with --otlp-endpoint: the percentage of requests Envoy starts a sampled trace for when the "
                        "client sent no traceparent (default 100); a client's traceparent decides for its own request")
    p.add_argument("--print-bootstrap", action="store_true", help="print the Envoy bootstrap and exit")
    p.add_argument("--picker", default="127.0.0.1:9002", help="with --print-bootstrap: the picker's ip:port")
    p.add_argument("--endpoint", action="append", default=[], metavar="IP:PORT",
                   help="with --print-bootstrap: a model server's gRPC endpoint (repeatable)")
    p.add_argument("--eds-path", help="with --print-bootstrap: a pool file (EDS) for Envoy to watch instead")
    from policyc.server.security_flags import add_security_flags

    add_security_flags(p)  # --token, --open-fleet, TLS, the audit log: the same for `serve` and `gateway`
    from policyc.cli.gateway_flags import add_limit_flags
    from policyc.cluster.serve_flags import add_fleet_flags

    add_fleet_flags(p)  # --state-dir (the registry kept across restarts, as `serve` keeps it), --etcd …
    from policyc.cli.scrape_flags import add_scrape_flags

    add_scrape_flags(p)  # --scrape-interval, --no-scrape: the model servers' own metrics to the placer
    p.add_argument("--candidates", type=int, default=8, metavar="N",
                   help="instances the matcher hands the placer at a time, best ranked first (default 8); the placer's "
                        "measured signals choose among them")
    p.add_argument("--refresh", type=float, default=0.2, metavar="SECONDS",
                   help="the placer's telemetry refresh interval (default 0.2); the scraped readings are taken again "
                        "every scrape interval in between, so a server's queue reaches placement within two scrape ticks")
    add_limit_flags(p)  # what one client may hold: timeouts, connections, streams, headers, picks waiting
    p.set_defaults(func=run)


def _fail(msg: str) -> int:
    print(f"policyc gateway: error: {msg}", file=sys.stderr)
    return 2


def _print_bootstrap(args) -> int:  # type: ignore[no-untyped-def]
    from policyc.gateway.bootstrap import GatewaySpec, build_bootstrap

    budget = None
    if args.bundle:
        from policyc.compiler import bundle_io
        from policyc.enforcer.rule_table import build_rule_table
        from policyc.gateway.runner import retry_budget

        try:
            budget = retry_budget(build_rule_table(bundle_io.load(args.bundle)))
        except (bundle_io.BundleError, ValueError) as e:
            return _fail(str(e))
    if not args.endpoint and not args.eds_path:
        return _fail("--print-bootstrap needs the pool: --endpoint IP:PORT (repeatable) or --eds-path FILE")
    from policyc.cli.gateway_flags import limits_from

    from policyc.gateway.tracing import check_endpoint

    try:
        otlp = check_endpoint(args.otlp_endpoint) if args.otlp_endpoint is not None else None
        if not 0.0 <= args.otlp_sampling <= 100.0:
            raise ValueError(f"--otlp-sampling {args.otlp_sampling:g}: a percentage in [0, 100]")
        boot = build_bootstrap(GatewaySpec(picker=args.picker, listen=args.listen, admin=args.admin,
                                           endpoints=tuple(args.endpoint), eds_path=args.eds_path,
                                           failure_mode_allow=args.failure_mode_allow, retry_budget=budget,
                                           limits=limits_from(args), otlp_endpoint=otlp, otlp_sampling=args.otlp_sampling))
    except ValueError as e:
        return _fail(str(e))
    print(json.dumps(boot, indent=2))
    return 0


def run(args) -> int:  # type: ignore[no-untyped-def]
    if args.print_bootstrap:
        return _print_bootstrap(args)
    from .extras import require

    require("gateway", command="gateway")
    if not args.bundle:
        return _fail("give --bundle (or --print-bootstrap)")
    from policyc.compiler import bundle_io
    from policyc.gateway.envoy_process import EnvoyError
    from policyc.gateway.runner import Gateway, GatewayOptions
    from policyc.matcher.instance import canonical_endpoint
    from policyc.server.app import DecisionServer, ServerThread
    from policyc.cli.keys import KeyError_, load_public
    from policyc.server.config import EnforcerMode, SelfHeal, ServeConfig, Telemetry
    from policyc.server.transport import TransportError
    from policyc.audit.errors import AuditError
    from policyc.cluster.store import StoreError

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        key = load_public(args.public_key) if args.public_key else None
    except KeyError_ as e:
        return _fail(str(e))
    try:
        bundle = bundle_io.load(args.bundle, public_key=key)
        for flag, value in (("--listen", args.listen), ("--admin", args.admin)):
            try:
                canonical_endpoint(value)
            except ValueError as e:
                raise ValueError(f"{flag} {e}") from None
        if args.max_in_flight < 1:
            raise ValueError(f"--max-in-flight must be at least 1, got {args.max_in_flight}")
        if not ipaddress.ip_address(canonical_endpoint(args.admin).rpartition(":")[0].strip("[]")).is_loopback:
            raise ValueError(f"--admin {args.admin}: Envoy's admin interface listens on loopback only "
                             "(it can stop Envoy and read its configuration), e.g. 127.0.0.1:9901")
        from policyc.cli.gateway_flags import limits_from
        from policyc.cluster.serve_flags import fleet_config

        limits = limits_from(args)
        fleet = fleet_config(args, key)
        from policyc.gateway.llm_side import LlmOptions, parse_tokenizer_option

        otlp = None
        if args.otlp_endpoint is not None:
            from policyc.gateway.tracing import available, check_endpoint

            otlp = check_endpoint(args.otlp_endpoint)
            if not 0.0 <= args.otlp_sampling <= 100.0:
                raise ValueError(f"--otlp-sampling {args.otlp_sampling:g}: a percentage in [0, 100]")
            if (missing := available()) is not None:
                raise ValueError(f"--otlp-endpoint: {missing}")
        llm = None if args.no_llm else LlmOptions(tokenizers=tuple(parse_tokenizer_option(t) for t in args.tokenizer))
    except (bundle_io.BundleError, ValueError) as e:
        return _fail(str(e))
    from policyc.cli.cmd_serve import check_private_key, fleet_access
    from policyc.cluster.serve_flags import token_dir
    from policyc.server.security_flags import security_config

    try:
        security = security_config(args, check_private_key)
    except ValueError as e:
        return _fail(str(e))
    from policyc.cli.scrape_flags import scrape_budget, scrape_interval

    if not 0.01 <= args.refresh <= 3600:
        return _fail(f"--refresh {args.refresh:g}: expected seconds in [0.01, 3600]")
    if not 1 <= args.candidates <= 4096:
        return _fail(f"--candidates {args.candidates}: expected 1 to 4096")
    cfg = ServeConfig(port=args.port, enforcer=EnforcerMode(args.enforcer), self_heal=SelfHeal(args.self_heal), bundle_key=key,
                      telemetry=Telemetry(args.telemetry), settle_heap=True, refresh_interval=args.refresh,
                      metrics_scrape_interval=scrape_interval(args), metrics_scrape_budget=scrape_budget(args), candidates=args.candidates,
                      token_dir=token_dir(args, fleet, args.port), fleet=fleet, **security)
    # before anything serves: Envoy answers clients before `gw.start()` has seen it ready, and a
    # SIGTERM in that window killed the process outright (exit -15, seen in CI) instead of stopping it
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        thread = ServerThread(DecisionServer(bundle, cfg))
        api_port = thread.start()
    except (TransportError, OSError, ValueError, RuntimeError, AuditError, StoreError) as e:
        return _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    # the gateway's files (Envoy's pid file among them) beside the registry it keeps, so a restart finds both;
    # a replica (--etcd) keeps them in its port's default state dir; `--state-dir none`, `--port 0`: a temp dir
    from policyc.cluster.serve_flags import default_state_dir

    kept = fleet.state_dir if fleet is not None and fleet.state_dir is not None else \
        None if args.state_dir == "none" else default_state_dir(args.port)
    workdir = Path(args.workdir) if args.workdir else kept / "gateway" if kept is not None else None
    options = GatewayOptions(listen=args.listen, admin=args.admin, picker_port=args.picker_port,
                             failure_mode_allow=args.failure_mode_allow, max_in_flight=args.max_in_flight,
                             concurrency=args.concurrency, workdir=workdir, limits=limits, llm=llm, otlp_endpoint=otlp,
                             otlp_sampling=args.otlp_sampling)
    from policyc.gateway.tokens import TokenizerError

    try:
        gw = Gateway(thread, options)
    except TokenizerError as e:
        thread.stop()
        return _fail(str(e))
    try:
        gw.start()
    except (EnvoyError, TransportError, OSError) as e:
        gw.stop()
        thread.stop()
        return _fail(str(e))
    if gw.envoy is not None and gw.envoy.cleared is not None:
        print(f"policyc gateway: stopped a stale Envoy of this gateway (pid {gw.envoy.cleared}) left by an earlier run",
              file=sys.stderr)
    print(f"policyc gateway: clients -> {args.listen} (Envoy, admin {args.admin}); picker on 127.0.0.1:{gw.picker.port}; "
          f"decision API (RegisterInstance with deployment.endpoint) on 127.0.0.1:{api_port}; files in {gw.workdir}; "
          f"{fleet_access(thread.server)}",
          file=sys.stderr, flush=True)
    audit = thread.server.audit
    said = False
    while not stop.wait(0.5):
        if gw.envoy is not None and not gw.envoy.alive():
            gw.stop()
            thread.stop()
            _audit_loss(audit)
            return _fail(f"envoy exited; its log: {gw.envoy.log_path}")
        if audit is not None and audit.log.stopped is not None and not said:  # fails closed: every pick refused
            print(f"policyc gateway: the audit log stopped ({audit.log.stopped}): requests are refused until restart",
                  file=sys.stderr, flush=True)
            said = True
    gw.stop()
    thread.stop()
    if _audit_loss(audit):
        return 1  # Exit.FAILED, as `policyc serve`
    print("policyc gateway: stopped", file=sys.stderr)
    return 0


def _audit_loss(audit) -> bool:  # type: ignore[no-untyped-def]
    """Say what the audit log lost, as `policyc serve` does; True when it lost anything."""
    from policyc.cli.audit_exit import audit_loss

    lost = audit_loss(audit)
    if lost is not None:
        print(f"policyc gateway: {lost}", file=sys.stderr)
    return lost is not None
