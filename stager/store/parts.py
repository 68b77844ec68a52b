"""Bookkeeping shared by the multipart uploads: which parts arrived, and are they a valid object."""

from __future__ import annotations

#: S3's limit, applied everywhere so that an upload plan that works on one store works on all.
MAX_PARTS = 10_000


class PartLedger:
    """The parts written so far of one upload of ``path`` cut into ``part_size`` pieces."""

    __slots__ = ("path", "part_size", "sizes")

    def __init__(self, path: str, part_size: int) -> None:
        if not isinstance(part_size, int) or part_size <= 0:
            raise ValueError(f"{path}: part size must be a positive int, got {part_size!r}")
        self.path = path
        self.part_size = part_size
        self.sizes: dict[int, int] = {}

    def add(self, part_number: int, size: int) -> int:
        """Record a part and return its offset in the object.

        Raises:
            ValueError: a part number outside 1..MAX_PARTS, or a part larger than ``part_size``.
        """
        if not isinstance(part_number, int) or not 1 <= part_number <= MAX_PARTS:
            raise ValueError(f"{self.path}: part number must be in 1..{MAX_PARTS}, got {part_number!r}")
        if size > self.part_size:
            raise ValueError(f"{self.path}: part {part_number} has {size} bytes, more than the part size {self.part_size}")
        self.sizes[part_number] = size
        return (part_number - 1) * self.part_size

    def total(self) -> int:
        """The object's size, once the parts form one: 1..N, all but the last full.

        Raises:
            ValueError: a part is missing, or a part other than the last is short.
        """
        n = len(self.sizes)
        if n == 0:
            return 0
        if max(self.sizes) != n:
            missing = sorted(set(range(1, max(self.sizes) + 1)) - set(self.sizes))
            raise ValueError(f"{self.path}: parts {missing[:5]} missing")
        for number in range(1, n):
            if self.sizes[number] != self.part_size:
                raise ValueError(
                    f"{self.path}: part {number} has {self.sizes[number]} bytes; "
                    f"only the last part may be shorter than {self.part_size}"
                )
        return (n - 1) * self.part_size + self.sizes[n]
