"""The end-to-end demo (`policyc demo`, `make demo`) on the real data plane: Envoy, a small
pool of real KServe model servers on loopback, policyc as Envoy's endpoint picker, beside
the simulated cluster that keeps placement at scale.

- `run`             the scenario in order; `run_demo(out, workdir)`
- `host_fleet`      where root and network namespaces allow: three namespace hosts, each
                    with its TPM and its agent running the real servers (`--fleet hosts`)
- `model_pool`      which instances are real servers, on which simulated GPU slots
- `fleet_scene`     registering the fleet (simulated, refused ONNX, real with endpoints)
- `gateway_up`      the picker and Envoy in front of the pool
- `traffic`         OIP calls through Envoy and what the client sees
- `decision_scenes` the decision API's own scenes, the self-heal, Explain
- `narration`       output and `DemoError`

The demo compiles `policies/` itself (as a user would with `policyc compile`); everything
it starts reads the bundle only.
"""
