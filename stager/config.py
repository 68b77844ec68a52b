"""Configuration: small frozen value objects built once at the edge.

The CLI, the daemon and the dataset constructors build these from, in order of
precedence, explicit arguments (flags), the environment (``STAGER_*``) and an
optional TOML file (``--config`` or ``STAGER_CONFIG``), then pass them down.
Nothing below the edge reads the environment or a file for settings. Storage
credentials are the exception by design: fsspec backends read the usual
``AWS_*`` variables themselves, and ``storage_options`` add to them.

Values are validated in ``__post_init__`` so a bad value fails where it enters,
with a :class:`~stager.errors.ConfigError` that names it.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

DEFAULT_BLOCK_SIZE = 1 * MiB
DEFAULT_CACHE_DIR = "~/.cache/stager"

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "ki": KiB, "kib": KiB,
    "m": 1000**2, "mb": 1000**2, "mi": MiB, "mib": MiB,
    "g": 1000**3, "gb": 1000**3, "gi": GiB, "gib": GiB,
    "t": 1000**4, "tb": 1000**4, "ti": TiB, "tib": TiB,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int | float, *, what: str = "size") -> int:
    """Parse ``"500GB"``, ``"8MiB"``, ``"1.5G"`` or a plain number of bytes.

    Raises:
        ConfigError: the text is not a non-negative size with a known unit.
    """
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a size, got {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ConfigError(f"{what}: must not be negative, got {text!r}")
        return int(text)
    match = _SIZE_RE.match(str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"{what}: {text!r} is not a size (examples: 500GB, 8MiB, 1048576)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_rate(text: str | int | float | None, *, what: str = "bandwidth") -> int | None:
    """Parse a byte rate such as ``"200MB/s"`` or ``"1GiB"`` (per second); None or 0 means unlimited."""
    if text is None or text == "" or text == 0:
        return None
    if isinstance(text, str) and text.strip().lower().endswith("/s"):
        text = text.strip()[:-2]
    rate = parse_size(text, what=what)
    return rate or None


def parse_fraction_or_size(text: str, *, what: str = "capacity") -> tuple[int | None, float | None]:
    """Parse a capacity given as bytes (``"500GB"``) or a share of the disk (``"80%"``, ``"0.8"``)."""
    s = str(text).strip()
    try:
        if s.endswith("%"):
            share = float(s[:-1]) / 100
        elif re.fullmatch(r"0?\.[0-9]+|1(\.0+)?", s):
            share = float(s)
        else:
            return parse_size(s, what=what), None
    except ValueError as exc:
        raise ConfigError(f"{what}: {text!r} is not a size or a share of the disk") from exc
    if not 0 < share <= 1:
        raise ConfigError(f"{what}: a share of the disk must be in (0%, 100%], got {text!r}")
    return None, share


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """Where a dataset lives: an fsspec URL (or a bare path) and its storage options."""

    url: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.url or not isinstance(self.url, str):
            raise ConfigError("source: an URL or a path is required")


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """How the store retries transient origin failures (exponential backoff with full jitter)."""

    attempts: int = 8
    backoff_base: float = 0.1
    backoff_max: float = 10.0
    deadline: float = 120.0  # seconds one block may take across all its attempts
    request_timeout: float = 60.0  # seconds one request may take

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError(f"retry attempts must be >= 1, got {self.attempts}")
        for name in ("backoff_base", "backoff_max", "deadline", "request_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"retry {name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class FetchConfig:
    """How the engine fetches: concurrency, window, hedging, bandwidth."""

    # The most block requests in flight: the ceiling of the adaptive limit (engine/concurrency.py),
    # which starts at 16 and follows the origin; memory bounds it further (requests x their buffers).
    concurrency: int = 256
    request_bytes: int = 8 * MiB  # the most one ranged GET asks for: consecutive wanted blocks share a request
    window_bytes: int = 2 * GiB  # how far ahead of each consumer's cursor to stage
    bandwidth: int | None = None  # bytes per second, None = unlimited
    hedge: bool = True
    hedge_factor: float = 2.0  # a request slower than p95 * factor is raced
    hedge_min_delay: float = 0.2  # seconds; never hedge sooner than this
    # fdatasync each block before the index records it. Off by default: a block survives a
    # process kill in the page cache anyway, blocks recorded without it carry the boot id and
    # are fetched again after a reboot, and complete blobs are always fsynced before commit.
    durable: bool = False
    retry: RetryConfig = field(default_factory=RetryConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= 4096:
            raise ConfigError(f"concurrency must be in 1..4096, got {self.concurrency}")
        if self.window_bytes <= 0:
            raise ConfigError(f"window must be > 0 bytes, got {self.window_bytes}")
        if self.request_bytes <= 0:
            raise ConfigError(f"request size must be > 0 bytes, got {self.request_bytes}")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ConfigError(f"bandwidth must be > 0, got {self.bandwidth}")
        if self.hedge_factor < 1:
            raise ConfigError(f"hedge factor must be >= 1, got {self.hedge_factor}")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The node-local cache tier: a directory and a capacity (bytes, or a share of its disk)."""

    directory: Path = Path(DEFAULT_CACHE_DIR).expanduser()
    capacity: int | None = None
    capacity_share: float | None = 0.8
    #: Write staged bytes with O_DIRECT, past the page cache (see stager/cache/direct.py); where the
    #: filesystem refuses, writes go through the page cache whatever this says.
    direct_writes: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory).expanduser())
        if self.capacity is not None and self.capacity <= 0:
            raise ConfigError(f"cache capacity must be > 0, got {self.capacity}")
        if self.capacity is None and self.capacity_share is None:
            raise ConfigError("cache capacity: give bytes or a share of the disk")

    def capacity_bytes(self) -> int:
        """The capacity in bytes, resolving a share against the disk holding the directory."""
        if self.capacity is not None:
            return self.capacity
        probe = self.directory
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        st = os.statvfs(probe)
        return int(st.f_blocks * st.f_frsize * (self.capacity_share or 1.0))


def load_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a stager TOML config file.

    Raises:
        ConfigError: the file is missing or not valid TOML (naming the file).
    """
    p = Path(path).expanduser()
    try:
        with p.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"{p}: config file not found") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config file: {exc.strerror}") from exc
    return data


def env_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``STAGER_*`` variables as lower-case keys without the prefix (``STAGER_CACHE`` -> ``cache``)."""
    env = os.environ if environ is None else environ
    return {k[len("STAGER_"):].lower(): v for k, v in env.items() if k.startswith("STAGER_") and v != ""}


def with_overrides(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` that ignores None values and unknown names."""
    names = {f.name for f in fields(obj)}
    return replace(obj, **{k: v for k, v in changes.items() if v is not None and k in names})
