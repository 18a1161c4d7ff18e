"""The data plane's gateway side: policyc as Envoy's ext_proc endpoint picker (the Gateway API
Inference Extension's Endpoint Picker Protocol), the Envoy bootstrap for a registered pool,
and the Envoy process that runs it."""
