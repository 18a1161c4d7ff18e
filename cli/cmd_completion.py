"""`policyc completion bash|zsh`: a shell completion script, made from the parser itself.

Every command, subcommand and option `policyc` has is completed, so a new command is
completed as soon as it exists. Install: `policyc completion bash > /etc/bash_completion.d/policyc`,
or `source <(policyc completion bash)`; zsh: `source <(policyc completion zsh)` (bash
completion through zsh's `bashcompinit`).
"""

from __future__ import annotations

import argparse
import shlex

from .exit_codes import Exit
from .help import add_command


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "completion", help="print a shell completion script (bash or zsh)", description=__doc__,
                    codes=(Exit.OK, Exit.USAGE),
                    examples=["source <(policyc completion bash)", "policyc completion zsh > ~/.zfunc/_policyc"])
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell")
    p.set_defaults(func=run)


def _tree(parser: argparse.ArgumentParser, path: str, out: dict[str, tuple[list[str], list[str]]]) -> None:
    """`path` (commands joined by spaces) → (subcommands, options) for every parser below."""
    subs: list[str] = []
    opts: list[str] = []
    for action in parser._actions:
        opts += [o for o in action.option_strings if o.startswith("--") or len(o) == 2]
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                subs.append(name)
                _tree(child, f"{path} {name}".strip(), out)
    out[path] = (sorted(subs), sorted(set(opts)))


def bash_script(parser: argparse.ArgumentParser) -> str:
    tree: dict[str, tuple[list[str], list[str]]] = {}
    _tree(parser, "", tree)
    cases = []
    for path, (subs, opts) in sorted(tree.items()):
        words = " ".join(subs + opts)
        cases.append(f"    {shlex.quote(path or '-')}) words={shlex.quote(words)} ;;")
    body = "\n".join(cases)
    return f"""# policyc completion for bash (policyc completion bash)
_policyc() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} path="" i w words
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${{COMP_WORDS[i]}}
    [[ $w == -* ]] && continue
    if _policyc_known "${{path:+$path }}$w"; then path="${{path:+$path }}$w"; fi
  done
  case "${{path:--}}" in
{body}
    *) words="" ;;
  esac
  if [[ $cur == -* || -n $words ]]; then
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
  fi
  [[ ${{#COMPREPLY[@]}} -eq 0 ]] && COMPREPLY=($(compgen -f -- "$cur"))
  return 0
}}
_policyc_known() {{
  case "$1" in
    {"|".join(shlex.quote(p) for p in sorted(tree) if p)}) return 0 ;;
  esac
  return 1
}}
complete -F _policyc policyc
"""


ZSH_PRELUDE = "# policyc completion for zsh (bash completion through bashcompinit)\nautoload -U +X bashcompinit && bashcompinit\n"


def run(args: argparse.Namespace) -> int:
    from .main import build_parser

    script = bash_script(build_parser())
    if args.shell == "zsh":
        script = ZSH_PRELUDE + script
    print(script, end="")
    return Exit.OK
