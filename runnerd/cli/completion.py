"""``runnerd completion bash``: a bash completion script for the CLI, made from its own
parser, so it names every command and flag of this version and needs no package.

``eval "$(runnerd completion bash)"`` in ~/.bashrc (or the output saved to
/etc/bash_completion.d/runnerd) completes commands, their subcommands, their flags and
the values a flag takes from a fixed list; other words complete as file names.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

__all__ = ["register_completion"]


def _tables(
    parser: argparse.ArgumentParser,
    path: str,
    words: dict[str, list[str]],
    values: dict[str, list[str]],
) -> None:
    """Fill ``words``: for each command path (``"runnerd app secrets"``), its subcommands
    and then its flags; and ``values``: for each ``path --flag`` of fixed choices, those."""
    commands: list[str] = []
    flags: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                commands.append(name)
                _tables(sub, f"{path} {name}", words, values)
        elif action.option_strings:
            flags += [o for o in action.option_strings if o.startswith("--")]
            if action.choices:
                for option in action.option_strings:
                    values[f"{path} {option}"] = [str(c) for c in action.choices]
    words[path] = commands + flags


# Words past the command path complete as file names (an app folder, @FILE, a backup).
_SCRIPT = """
_runnerd_complete() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} path=runnerd i
    for ((i = 1; i < COMP_CWORD; i++)); do
        if [[ ${COMP_WORDS[i]} != -* && -n ${_runnerd_words["$path ${COMP_WORDS[i]}"]+x} ]]; then
            path="$path ${COMP_WORDS[i]}"
        fi
    done
    local here=${_runnerd_words["$path"]}
    if [[ $prev == --* && -n ${_runnerd_values["$path $prev"]+x} ]]; then
        COMPREPLY=($(compgen -W "${_runnerd_values["$path $prev"]}" -- "$cur"))
    elif [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$here" -- "$cur"))
    elif [[ -n $here && ${here%%-*} != "" && ${here:0:1} != - ]]; then
        COMPREPLY=($(compgen -W "${here%% --*}" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -o filenames -o bashdefault -F _runnerd_complete runnerd
"""


def cmd_completion(args: argparse.Namespace) -> int:
    """Print the script (module docstring); 0."""
    words: dict[str, list[str]] = {}
    values: dict[str, list[str]] = {}
    _tables(args.root_parser, "runnerd", words, values)
    lines = ['# bash completion for runnerd: eval "$(runnerd completion bash)"']
    for name, table in (("_runnerd_words", words), ("_runnerd_values", values)):
        lines.append(f"declare -gA {name}=(")
        lines += [
            f"    [{shlex.quote(k)}]={shlex.quote(' '.join(v))}" for k, v in sorted(table.items())
        ]
        lines.append(")")
    sys.stdout.write("\n".join(lines) + _SCRIPT)
    return 0


def register_completion(groups: Any, root: argparse.ArgumentParser) -> None:
    """Add ``completion`` to the CLI's parser (``root``: what the script completes)."""
    p = groups.add_parser(
        "completion",
        help='print a shell completion script: eval "$(runnerd completion bash)"',
    )
    p.add_argument("shell", choices=("bash",), help="the shell (bash)")
    p.set_defaults(func=cmd_completion, root_parser=root)
