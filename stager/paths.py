"""The one rule for object paths, shared by the manifest's validation and every store.

A manifest's paths are untrusted input, and a store is handed them to read:
both must judge a path alike, or ``stager index --check`` calls a manifest
valid that ``stager stage`` then refuses. A safe path is non-empty,
``/``-separated and relative, with no empty, ``.`` or ``..`` segment, no
trailing ``/``, no backslash (a separator on Windows, and an escape to many
tools) and no control character.

The rule is one regular expression, so the manifest can apply it to a million
paths at once in Arrow (RE2 syntax, which this pattern shares with ``re``).
"""

from __future__ import annotations

import re

#: Matches a path that is NOT safe: empty, absolute, '.' or '..' segments, empty
#: segments, a trailing '/', a backslash, control characters.
BAD_PATH_PATTERN = r"(^$|^/|(^|/)\.\.?(/|$)|//|/$|[\x00-\x1f\\])"

#: What is wrong with a path that :data:`BAD_PATH_PATTERN` matches, for error messages.
BAD_PATH_PROBLEM = ("path is empty, absolute, or has '.', '..' or empty segments, a backslash "
                    "or a control character")

_BAD_PATH = re.compile(BAD_PATH_PATTERN)


def is_safe_path(path: object) -> bool:
    """Whether ``path`` is a ``str`` that :data:`BAD_PATH_PATTERN` does not match."""
    return isinstance(path, str) and _BAD_PATH.search(path) is None
