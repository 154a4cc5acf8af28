"""``ferryman completion bash | zsh``: a completion script for the commands, their options
and choices, read from the parsers themselves."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ferryman.cli.common import RAW

if TYPE_CHECKING:
    from ferryman.cli.common import Subcommands

__all__ = ["add_parser", "run", "script"]

EXAMPLES = """examples:
  source <(ferryman completion bash)              # in ~/.bashrc
  ferryman completion zsh > "${fpath[1]}/_ferryman" # then restart zsh"""


def add_parser(sub: Subcommands, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for bash or zsh on stdout.",
        epilog=EXAMPLES,
        formatter_class=RAW,
        parents=parents,
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    # The commands to complete: every one added to ``sub``, before or after this one.
    completion.set_defaults(subcommands=sub)
    return completion


def run(args: argparse.Namespace) -> int:
    print(script(args.shell, args.subcommands), end="")
    return 0


def script(shell: str, subcommands: Subcommands) -> str:
    """A bash or zsh completion script for ``subcommands``, their options and choices."""
    commands, values = _words(subcommands)
    top = " ".join([*commands, "--version", "--help", "--debug"])
    cases = "\n".join(
        f'        {name}) words="{" ".join(o for o in opts if o != "@dirs")}"'
        f"{'; dirs=1' if '@dirs' in opts else ''} ;;"
        for name, opts in commands.items()
    )
    prev_cases = "\n".join(
        f"        {flag}) "
        + (
            'COMPREPLY=($(compgen -d -- "$cur")); return ;;'
            if words == "@dirs"
            else f'COMPREPLY=($(compgen -W "{words}" -- "$cur")); return ;;'
        )
        for flag, words in sorted(values.items())
    )
    body = f"""_ferryman() {{
    local cur prev words dirs=0 i command=""
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in -*) ;; *) command="${{COMP_WORDS[i]}}"; break ;; esac
    done
    if [[ -z "$command" ]]; then
        COMPREPLY=($(compgen -W "{top}" -- "$cur"))
        return
    fi
    case "$prev" in
{prev_cases}
    esac
    case "$command" in
{cases}
        *) return ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
    if [[ $dirs == 1 && $cur != -* ]]; then
        COMPREPLY+=($(compgen -d -- "$cur"))
    fi
}}
complete -F _ferryman ferryman
"""
    if shell == "zsh":
        return "#compdef ferryman\nautoload -U +X bashcompinit && bashcompinit\n" + body
    return "# bash completion for ferryman\n" + body


def _words(subcommands: Subcommands) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Each command's words (its options, a positional's choices, ``@dirs`` for a path),
    and the values each option takes."""
    commands: dict[str, list[str]] = {}
    values: dict[str, str] = {}  # option -> a compgen word list, or a marker for paths
    for name, sub in subcommands.choices.items():
        options = []
        for option in sub._actions:
            options += [o for o in option.option_strings if o.startswith("--")]
            for flag in option.option_strings:
                if option.choices:
                    values[flag] = " ".join(str(c) for c in option.choices)
                elif option.type is Path:
                    values[flag] = "@dirs"
            if not option.option_strings and option.choices:
                options += [str(c) for c in option.choices]
            elif not option.option_strings and option.type is Path:
                options.append("@dirs")
        commands[name] = options
    return commands, values
