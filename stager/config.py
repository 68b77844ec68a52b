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

import math
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
#: Seconds of a consumer's measured reading a plan stages ahead of its cursor (past its floor, within its
#: byte window; see stager/engine/read_ahead.py). A minute rides out the origin's slow spells (a throttled
#: or congested link, retries of a shard) with room to spare, yet a job that stops early leaves at most a
#: minute of its reading fetched for nothing, and nodes sharing one origin link each take what they use.
DEFAULT_AHEAD_SECONDS = 60.0
#: Where the cache and replicate's state lived before they followed the XDG base directories.
LEGACY_CACHE_DIR = "~/.cache/stager"
LEGACY_STATE_ROOT = "~/.cache/stager/replicate"
#: The default cache directory as help texts name it (:func:`default_cache_dir` resolves it).
DEFAULT_CACHE_DIR_HELP = "$XDG_CACHE_HOME/stager, else ~/.cache/stager"
#: Words that say "no bandwidth cap" outright.
UNLIMITED = frozenset({"unlimited", "none"})

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "ki": KiB, "kib": KiB,
    "m": 1000**2, "mb": 1000**2, "mi": MiB, "mib": MiB,
    "g": 1000**3, "gb": 1000**3, "gi": GiB, "gib": GiB,
    "t": 1000**4, "tb": 1000**4, "ti": TiB, "tib": TiB,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def _named(what: str | None, message: str) -> str:
    return f"{what}: {message}" if what else message


def parse_size(text: str | int | float, *, what: str | None = "size") -> int:
    """Parse ``"500GB"``, ``"8MiB"``, ``"1.5G"`` or a plain number of bytes.

    ``what`` (the flag, key or variable) starts the message of the error; None leaves it out.

    Raises:
        ConfigError: the text is not a non-negative size with a known unit.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ConfigError(_named(what, f"expected a size such as 8MiB, got {text!r}"))
    if isinstance(text, (int, float)):
        if not math.isfinite(text) or text < 0:
            raise ConfigError(_named(what, f"a size must be a finite number of bytes >= 0, got {text!r}"))
        return int(text)
    match = _SIZE_RE.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(_named(what, f"{text!r} is not a size (examples: 500GB, 8MiB, 1048576)"))
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_rate(text: str | int | float | None, *, what: str | None = "bandwidth") -> int | None:
    """Parse a byte rate such as ``"200MB/s"`` or ``"1GiB"`` (per second); None, ``"unlimited"`` or ``"none"``: no cap.

    Raises:
        ConfigError: not a rate, or zero (which would never move a byte: say ``unlimited`` instead).
    """
    if text is None or (isinstance(text, str) and text.strip().lower() in UNLIMITED | {""}):
        return None
    if isinstance(text, str) and text.strip().lower().endswith("/s"):
        text = text.strip()[:-2]
    rate = parse_size(text, what=what)
    if rate == 0:
        raise ConfigError(_named(what, "a cap of 0 bytes/s would never move a byte; for no cap leave it unset "
                                       "or write 'unlimited'"))
    return rate


def parse_capacity(text: str | int, *, what: str | None = "capacity") -> tuple[int | None, float | None]:
    """Parse a capacity: bytes with a unit (``"500GB"``), a whole number of bytes, or a share of the disk (``"80%"``).

    Returns ``(bytes, None)`` or ``(None, share)``. A bare number up to 1 (``"1"``, ``"0.8"``) is
    refused: it reads as a share as easily as bytes.

    Raises:
        ConfigError: not a capacity, zero, a share outside (0%, 100%], or ambiguous.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ConfigError(_named(what, f"expected a size (500GB) or a share of the disk (80%), got {text!r}"))
    s = str(text).strip()
    if s.endswith("%"):
        try:
            share = float(s[:-1])
        except ValueError:
            raise ConfigError(_named(what, f"{text!r} is not a share of the disk (examples: 80%, 50%)")) from None
        if not 0 < share <= 100:  # also refuses nan
            raise ConfigError(_named(what, f"a share of the disk must be in (0%, 100%], got {text!r}"))
        return None, share / 100
    if re.fullmatch(r"[0-9]*\.?[0-9]*", s) and s not in ("", "."):
        if "." in s or int(s) <= 1:
            raise ConfigError(_named(what, f"{text!r} is ambiguous: write a share of the disk with % "
                                           "(80%, 100%) or bytes with a unit (500GB, 1B)"))
        return int(s), None
    size = parse_size(s, what=what)
    if size <= 0:
        raise ConfigError(_named(what, f"the capacity must be more than 0 bytes, got {text!r}"))
    return size, None


def parse_seconds(text: str | int | float, *, what: str | None = "seconds", minimum: float = 0.0,
                  allow_minimum: bool = False) -> float:
    """Parse a finite number of seconds above ``minimum`` (or equal to it with ``allow_minimum``).

    Raises:
        ConfigError: not a number, nan, infinite, or too small.
    """
    try:
        if isinstance(text, bool):
            raise ValueError
        value = float(text)
    except (TypeError, ValueError):
        raise ConfigError(_named(what, f"{text!r} is not a number of seconds")) from None
    if not math.isfinite(value):
        raise ConfigError(_named(what, f"{text!r} is not a finite number of seconds"))
    if value < minimum or (value == minimum and not allow_minimum):
        bound = f">= {minimum:g}" if allow_minimum else f"> {minimum:g}"
        raise ConfigError(_named(what, f"must be {bound} seconds, got {text!r}"))
    return value


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The cache directory when none is given: ``$XDG_CACHE_HOME/stager``, else ``~/.cache/stager``.

    A stager cache already at ``~/.cache/stager`` (the default before ``XDG_CACHE_HOME`` was
    honoured) keeps being used while nothing exists at the new place.
    """
    env = os.environ if environ is None else environ
    legacy = Path(LEGACY_CACHE_DIR).expanduser()
    base = env.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative value is invalid and ignored
        return legacy
    current = Path(base) / "stager"
    if current != legacy and not current.exists() and _is_cache(legacy):
        return legacy
    return current


def _is_cache(directory: Path) -> bool:
    from .cache.layout import FORMAT_FILE  # here, not at the top: the cache imports this module

    return (directory / FORMAT_FILE).is_file()


def default_state_root(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``stager replicate`` keeps its state: ``$XDG_STATE_HOME/stager/replicate``, else
    ``~/.local/state/stager/replicate`` (never inside the cache directory)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path("~/.local/state").expanduser()
    return root / "stager" / "replicate"


def move_legacy_replicate_state(environ: Mapping[str, str] | None = None) -> None:
    """Move replicate state left in ``~/.cache/stager/replicate`` (where older versions kept it)
    to :func:`default_state_root`, so that it stops making the default cache directory
    "not a stager cache and not empty".

    Each replication's directory moves with one rename; one that cannot move (another
    filesystem, a name taken at the new place) stays where it is and is used from there.
    """
    legacy = Path(LEGACY_STATE_ROOT).expanduser()
    if not legacy.is_dir():
        return
    target = default_state_root(environ)
    if target == legacy:
        return
    try:
        target.mkdir(parents=True, exist_ok=True)
        for entry in legacy.iterdir():
            if not (target / entry.name).exists():
                os.rename(entry, target / entry.name)
        legacy.rmdir()
    except OSError:
        pass  # left in place: state_dir_for still finds it there


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
    # which starts at 16 and follows the origin; memory bounds it further (the receive buffers held, measured).
    concurrency: int = 256
    request_bytes: int = 8 * MiB  # the most one ranged GET asks for: consecutive wanted blocks share a request
    window_bytes: int = 2 * GiB  # the most a plan stages ahead of its consumer's cursor (the cache's bound)
    # Seconds of the consumer's measured rate a plan stages ahead (past its floor, up to the window);
    # None: the engine's default, DEFAULT_AHEAD_SECONDS (through the daemon: the daemon's setting).
    ahead_seconds: float | None = None
    bandwidth: int | None = None  # bytes per second, None = unlimited
    hedge: bool = True
    hedge_factor: float = 2.0  # a request slower than p95 * factor is raced
    hedge_min_delay: float = 0.2  # seconds; never hedge sooner than this
    # fdatasync each block before the index records it, and fsync each blob before its commit. Off
    # by default: bytes survive a process kill in the page cache anyway; blocks recorded without it
    # carry the boot id and are fetched again after a reboot, and blobs committed without it carry
    # it too, and are hashed by every reader after a reboot before anything of them is served.
    durable: bool = False
    retry: RetryConfig = field(default_factory=RetryConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= 4096:
            raise ConfigError(f"concurrency must be in 1..4096, got {self.concurrency}")
        if self.window_bytes <= 0:
            raise ConfigError(f"window must be > 0 bytes, got {self.window_bytes}")
        if self.ahead_seconds is not None:
            object.__setattr__(self, "ahead_seconds", parse_seconds(self.ahead_seconds, what="ahead_seconds"))
        if self.request_bytes <= 0:
            raise ConfigError(f"request size must be > 0 bytes, got {self.request_bytes}")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ConfigError(f"bandwidth must be > 0, got {self.bandwidth}")
        if self.hedge_factor < 1:
            raise ConfigError(f"hedge factor must be >= 1, got {self.hedge_factor}")


#: The levels of ``CacheConfig.verify_reads``.
VERIFY_READS = ("first", "off")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The node-local cache tier: a directory and a capacity (bytes, or a share of its disk)."""

    directory: Path = field(default_factory=default_cache_dir)
    capacity: int | None = None
    capacity_share: float | None = 0.8
    #: Write staged bytes with O_DIRECT, past the page cache (see stager/cache/direct.py), instead of
    #: through it; where the filesystem refuses, writes go through the page cache whatever this says.
    #: Off by default: a disk slower than the link made direct writes the pace of staging (and held
    #: the bytes waiting for it in memory), where the page cache takes them at once (benchmarks/README).
    direct_writes: bool = False
    #: How much readers trust bytes already on the cache disk (see stager/cache/reader.py): "first"
    #: hashes each blob (the iterator) or block (the mount) the first time a process reads it, before
    #: serving it; "off" trusts the disk (every commit still re-hashes the whole file).
    verify_reads: str = "first"

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory).expanduser())
        if self.verify_reads not in VERIFY_READS:
            raise ConfigError(f"verify_reads must be one of {', '.join(VERIFY_READS)}, got {self.verify_reads!r}")
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


def parse_address(text: str, *, what: str = "--metrics-address") -> tuple[str, int]:
    """``"127.0.0.1:9464"``, ``"[::1]:9464"`` or ``":9464"`` (all interfaces) to (host, port).

    Raises:
        ConfigError: not HOST:PORT with a port in 0..65535.
    """
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what}: {text!r} is not HOST:PORT (example: 127.0.0.1:9464)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)
