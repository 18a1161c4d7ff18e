"""The end-to-end demo (`policyc demo`): above the runtime and the CLI's compiler, so that
the runtime never parses contract source."""
