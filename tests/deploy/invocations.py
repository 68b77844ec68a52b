"""Finding the `stager` commands written in deploy/, docs/ and the README, and the flags they use.

Two kinds of text hold commands. Kubernetes containers give them as argument lists (the image's
ENTRYPOINT is `stager`, so a container without `command` runs `stager ARGS`); there every
argument is exact. Everywhere else (shell scripts, Markdown code, a `sh -c` script in a
container) a command is found as `stager SUBCOMMAND` (or `$STAGER SUBCOMMAND`) on a logical
line (continuation lines joined) and its flags are the words after it up to the end of the
command (`;`, `&&`, `|`, a redirection or a comment).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator

#: A flag word: `--name`, `--name=value` or `-x` (a short flag), quotes and commas stripped first.
_FLAG = re.compile(r"^(--[A-Za-z][\w-]*|-[A-Za-z])(?:=.*)?$")
#: Words that end a command on a line.
_ENDS = {";", "&&", "||", "|", "&", ")", "}", "`"}
#: The command's name as scripts and docs write it, then global options, then the subcommand.
_COMMAND = re.compile(r"""(?:(?<![\w.-])stager|"?\$\{?STAGER\}?"?)(?P<globals>(?:\s+(?:--config[=\s]\S+|-v+|--verbose))*)"""
                      r"""\s+(?P<sub>[a-z]+)\b""")


@dataclass(frozen=True)
class Invocation:
    """One `stager SUBCOMMAND ...` found in a file, with the flags it passes."""

    where: str  # file (and line, or the container)
    subcommand: str  # a group's subcommand as "group sub" (`checkpoints list`)
    flags: tuple[str, ...]
    global_flags: tuple[str, ...] = ()  # given before the subcommand (`stager --config FILE serve`)


def flags_of(words: Iterable[str]) -> tuple[str, ...]:
    """The flag words among a command's arguments, without their values."""
    found = []
    for word in words:
        match = _FLAG.match(word.strip("\"',[]"))
        if match:
            found.append(match.group(1))
    return tuple(found)


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, line) with backslash-continued lines joined."""
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""
    if pending:
        yield start, pending


def _command_words(rest: str) -> list[str]:
    words = []
    for word in rest.split():
        if word.startswith("#") or word in _ENDS or re.match(r"^\d*[<>]", word):
            break
        if word.endswith(";"):
            words.append(word[:-1])
            break
        words.append(word)
    return words


def in_text(text: str, where: str, subcommands: Iterable[str], first_line: int = 1) -> list[Invocation]:
    """Every `stager SUBCOMMAND ...` in free text (a script, a code block, a `sh -c` argument)."""
    known = set(subcommands)
    found = []
    for number, line in logical_lines(text):
        number += first_line - 1
        for match in _COMMAND.finditer(line):
            if match.group("sub") not in known:
                continue
            sub, words = _nested(match.group("sub"), _command_words(line[match.end():]), known)
            found.append(Invocation(f"{where}:{number}", sub, flags_of(words),
                                    flags_of(match.group("globals").split())))
    return found


def in_container(container: dict, where: str, subcommands: Iterable[str]) -> list[Invocation]:
    """The `stager` command a Kubernetes container runs, if any (the image's ENTRYPOINT is `stager`)."""
    command = list(container.get("command") or [])
    args = [str(a) for a in container.get("args") or []]
    where = f"{where} container {container.get('name')}"
    if command in ([], ["stager"]):
        argv = args
    elif command[:2] in (["sh", "-c"], ["bash", "-c"]):
        return in_text("\n".join(command[2:] + args), where, subcommands)
    else:
        return []
    known = set(subcommands)
    if not argv or argv[0] not in known:
        return []
    sub, words = _nested(argv[0], argv[1:], known)
    return [Invocation(where, sub, flags_of(words))]


def _nested(sub: str, words: list[str], known: set[str]) -> tuple[str, list[str]]:
    """A group's subcommand (`checkpoints list`) as one name, its words after it; else as they were."""
    if words and f"{sub} {words[0]}" in known:
        return f"{sub} {words[0]}", words[1:]
    return sub, words


def markdown_code(text: str) -> list[tuple[int, str]]:
    """The code of a Markdown text, each piece with its first line: fenced blocks, then inline spans."""
    pieces = []
    fence = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
    for match in fence.finditer(text):
        pieces.append((text.count("\n", 0, match.start(1)) + 1, match.group(1)))
    prose = fence.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for match in re.finditer(r"`([^`\n]+)`", prose):
        pieces.append((prose.count("\n", 0, match.start()) + 1, match.group(1)))
    return pieces


def help_flags(help_text: str) -> set[str]:
    """Every flag a command's `--help` lists (long, short and the `--no-` halves of switches)."""
    flags: set[str] = set()
    in_options = False
    for line in help_text.splitlines():
        if line.startswith("Options:"):
            in_options = True
            continue
        if in_options and re.match(r"^\s{1,6}-", line):
            head = re.split(r"\s{2,}", line.strip())[0]
            flags.update(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", head))
    return flags


def help_subcommands(help_text: str) -> set[str]:
    """The subcommands `stager --help` lists."""
    section = help_text.split("Commands:", 1)[1] if "Commands:" in help_text else ""
    return set(re.findall(r"^\s{2}([a-z]+)\s", section, re.M))
