"""One TOML configuration file for the long-running commands (`serve`, `gateway`, `agent run`),
every flag settable there and by environment variable, `--print-config` to see the result.

Precedence, highest first: a flag on the command line; an environment variable
`POLICYC_<COMMAND>_<FLAG>` (`POLICYC_SERVE_PORT=50052`, `POLICYC_GATEWAY_MAX_IN_FLIGHT=256`;
a repeatable flag takes a comma-separated list, an on/off flag `1/0`, `true/false`,
`yes/no`); the `--config FILE` (or `$POLICYC_CONFIG`) table of the command
(`[serve]`, `[gateway]`, `[agent]`), whose keys are the flags' names without `--` (`-` or
`_` alike); then the built-in defaults.

    [serve]
    bundle = "bundle.json"
    port = 50051
    token = ["operator:…", "client:…"]
    audit-log = "audit.db"

Values are checked as the flag's own would be (type and choices), and a problem names the
file, the table and the key (or the variable) in one line, exit 2. `--print-config` prints
the effective configuration as TOML (a file `--config` reads back) and exits.
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from pathlib import Path
from typing import Any, NoReturn

from .exit_codes import Exit

SECTIONS = {"serve": ("serve",), "gateway": ("gateway",), "agent": ("agent", "run")}  # table -> the subcommand path
_SKIP = {"help", "config", "print_config", "func", "exit_codes"}


class ConfigError(Exception):
    """A configuration value that cannot be used; the message names where it came from."""


def _subparser(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> argparse.ArgumentParser | None:
    p: argparse.ArgumentParser | None = parser
    for name in path:
        sub = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None) if p else None
        p = sub.choices.get(name) if sub is not None else None
    return p


def _actions(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in p._actions if a.dest not in _SKIP and a.option_strings
            and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))}


def install(parser: argparse.ArgumentParser) -> None:
    """Add `--config` and `--print-config` to each configurable command."""
    for table, path in SECTIONS.items():
        p = _subparser(parser, path)
        if p is None or "config" in {a.dest for a in p._actions}:
            continue
        p.add_argument("--config", metavar="FILE",
                       help=f"TOML file whose [{table}] table sets any flag (default $POLICYC_CONFIG); flags and "
                            f"POLICYC_{table.upper()}_<FLAG> variables override it")
        p.add_argument("--print-config", action="store_true", help="print the effective configuration as TOML and exit")


def _convert(action: argparse.Action, value: Any, where: str) -> Any:
    """`value` (from TOML or the environment) as the flag would have parsed it."""
    flag = action.option_strings[-1]
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if isinstance(value, str):
            words = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
            if value.lower() not in words:
                raise ConfigError(f"{where}: expected true or false for {flag}, got `{value}`")
            value = words[value.lower()]
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false for {flag}, got {value!r}")
        return value
    many = isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*")
    if many:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ConfigError(f"{where}: expected a list for {flag}, got {value!r}")
        return [_one(action, v, where) for v in items]
    if isinstance(value, (list, dict)):
        raise ConfigError(f"{where}: expected one value for {flag}, got {value!r}")
    return _one(action, value, where)


def _one(action: argparse.Action, value: Any, where: str) -> Any:
    flag = action.option_strings[-1]
    text = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        out = action.type(text) if callable(action.type) else text  # type: ignore[misc]
    except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
        raise ConfigError(f"{where}: invalid value `{text}` for {flag}" + (f": {e}" if str(e) else "")) from None
    if action.choices is not None and out not in action.choices:
        raise ConfigError(f"{where}: `{text}` is not one of {', '.join(map(str, action.choices))} for {flag}")
    return out


def prepare(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Set the command's defaults from its config table and environment (before parsing)."""
    table = next((t for t, path in SECTIONS.items() if tuple(argv[:len(path)]) == path), None)
    if table is None:
        return
    p = _subparser(parser, SECTIONS[table])
    if p is None:
        return
    actions = _actions(p)
    values: dict[str, Any] = {}
    file = _config_path(argv)
    try:
        if file is not None:
            values.update(_from_file(file, table, actions))
        values.update(_from_env(table, actions))
    except ConfigError as e:
        _fail(str(e))
    for dest in values:
        actions[dest].required = False  # given by the file or the environment
    p.set_defaults(**values)


def _config_path(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--config="):
            return a.split("=", 1)[1]
    return os.environ.get("POLICYC_CONFIG") or None


def _from_file(file: str, table: str, actions: dict[str, argparse.Action]) -> dict[str, Any]:
    try:
        data = tomllib.loads(Path(file).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"--config {file}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config {file}: not valid TOML: {e}") from None
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"--config {file}: unknown table [{unknown[0]}]; the tables are {', '.join(f'[{t}]' for t in SECTIONS)}")
    section = data.get(table, {})
    if not isinstance(section, dict):
        raise ConfigError(f"--config {file}: `{table}` must be a table ([{table}])")
    out: dict[str, Any] = {}
    for key, value in section.items():
        dest = key.replace("-", "_")
        where = f"--config {file}: [{table}] {key}"
        if dest not in actions:
            from policyc.compiler.meaning import did_you_mean

            near = did_you_mean(key.replace("_", "-"), [d.replace("_", "-") for d in actions])
            raise ConfigError(f"{where}: no such setting" + (f"; did you mean `{near}`?" if near else ""))
        out[dest] = _convert(actions[dest], value, where)
    return out


def _from_env(table: str, actions: dict[str, argparse.Action]) -> dict[str, Any]:
    prefix = f"POLICYC_{table.upper()}_"
    out: dict[str, Any] = {}
    for name, value in os.environ.items():
        if not name.startswith(prefix):
            continue
        dest = name[len(prefix):].lower()
        if dest not in actions:
            continue  # a variable of another tool sharing the prefix is not ours to refuse
        out[dest] = _convert(actions[dest], value, f"${name}")
    return out


def print_config(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """The effective configuration of the command `argv` names, as its TOML table."""
    table = next((t for t, path in SECTIONS.items() if tuple(argv[:len(path)]) == path), None)
    p = _subparser(parser, SECTIONS[table]) if table else None
    if table is None or p is None:
        return int(Exit.USAGE)
    lines = [f"[{table}]"]
    for dest in _actions(p):
        v = getattr(args, dest, None)
        if v is None:
            continue
        if "token" in dest:  # the roles, never the secrets, reach stdout
            v = [f"{str(t).split(':', 1)[0]}:<redacted>" for t in v] if isinstance(v, list) else "<redacted>"
        lines.append(f"{dest.replace('_', '-')} = {_toml(v)}")
    print("\n".join(lines))
    return 0


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    import json

    return json.dumps(str(v), ensure_ascii=False)


def _fail(line: str) -> NoReturn:
    print(f"policyc: error: {line}", file=sys.stderr)
    raise SystemExit(Exit.USAGE)
