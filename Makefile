# The two commands of the README. Both do all set-up on a fresh machine.
PY := .venv/bin/python

.PHONY: demo test lint setup
demo: .venv/.ready
	$(PY) -m policyc.cli.main demo

# lint first (seconds), then the suite: a new ruff or mypy error fails CI (.ci/run) as a test would
test: .venv/.ready lint
	$(PY) -m pytest

lint: .venv/.ready
	.venv/bin/ruff check .
	.venv/bin/mypy

setup .venv/.ready: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
