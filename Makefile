# The two commands of the README. Both do all set-up on a fresh machine.
PY := .venv/bin/python

.PHONY: demo test setup
demo: .venv/.ready
	$(PY) -m policyc.cli.main demo

test: .venv/.ready
	$(PY) -m pytest

setup .venv/.ready: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
