"""Slurm host lists: ``SLURM_JOB_NODELIST`` expanded to host names, every bracket form Slurm writes.

A host list is a comma-separated list of host expressions (commas inside
brackets do not split). An expression is literal text and bracket groups in
any order and number; each group is a comma-separated list of numbers and
``lo-hi`` ranges, and the expression stands for every combination, the
rightmost group varying fastest, as ``scontrol show hostnames`` prints them::

    gpu[001-004,010],cpu7   ->  gpu001 gpu002 gpu003 gpu004 gpu010 cpu7
    a[1-2]-b[3-4]           ->  a1-b3 a1-b4 a2-b3 a2-b4
    rack[1-2]n[08-10]       ->  rack1n08 rack1n09 rack1n10 rack2n08 ...

A range keeps the zero padding of its lower bound (``[08-10]`` gives ``08
09 10``). Duplicates are dropped, first occurrence kept.
"""

from __future__ import annotations

import itertools
import re

from ..errors import ConfigError

#: More hosts than any cluster has: a typo such as ``[1-99999999]`` is refused, not expanded.
MAX_HOSTS = 100_000

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str, *, what: str = "SLURM_JOB_NODELIST") -> list[str]:
    """The host names of a Slurm host list, in order, without duplicates.

    Raises:
        ConfigError: unbalanced or nested brackets, an empty name or group, a range
            whose bounds are not numbers or are reversed, or more than :data:`MAX_HOSTS` hosts.
    """
    hosts: list[str] = []
    seen: set[str] = set()
    for expression in _split_top(text, what):
        for host in _expand_one(expression, text, what):
            if host not in seen:
                seen.add(host)
                hosts.append(host)
                if len(hosts) > MAX_HOSTS:
                    raise ConfigError(f"{what} {text!r}: more than {MAX_HOSTS} hosts")
    if not hosts:
        raise ConfigError(f"{what} {text!r}: names no host")
    return hosts


def _split_top(text: str, what: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, current = [], 0, []
    for ch in text.strip():
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ConfigError(f"{what} {text!r}: brackets inside brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"{what} {text!r}: ']' without '['")
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if depth:
        raise ConfigError(f"{what} {text!r}: '[' without ']'")
    parts.append("".join(current).strip())
    if any(not p for p in parts):
        raise ConfigError(f"{what} {text!r}: an empty host name (two commas in a row, or one at an end)")
    return parts


def _expand_one(expression: str, text: str, what: str) -> list[str]:
    pieces = re.split(r"(\[[^\]]*\])", expression)  # literal, [group], literal, [group], ...
    choices: list[list[str]] = []
    count = 1
    for piece in pieces:
        if piece.startswith("["):
            values = _group(piece[1:-1], text, what)
            count *= len(values)
            if count > MAX_HOSTS:
                raise ConfigError(f"{what} {text!r}: more than {MAX_HOSTS} hosts")
            choices.append(values)
        elif piece:
            if any(c.isspace() for c in piece):
                raise ConfigError(f"{what} {text!r}: a host name with a space in it ({piece!r})")
            choices.append([piece])
    return ["".join(combo) for combo in itertools.product(*choices)]


def _group(body: str, text: str, what: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise ConfigError(f"{what} {text!r}: [{body}] holds {item.strip()!r}, not a number or a range lo-hi")
        lo_text, hi_text = match.group(1), match.group(2)
        lo = int(lo_text)
        hi = int(hi_text) if hi_text is not None else lo
        if hi < lo:
            raise ConfigError(f"{what} {text!r}: the range {item.strip()!r} runs backwards")
        if hi - lo >= MAX_HOSTS:
            raise ConfigError(f"{what} {text!r}: more than {MAX_HOSTS} hosts")
        width = len(lo_text)
        values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values
