"""Files written whole or not at all, with the permissions any other file of the user's gets.

A file is written to a temporary name beside its target (`.NAME.` and 8 random characters), then renamed over
it, so a run stopped midway leaves the previous file, never half of a new one. The temporary file is made private by
`tempfile.mkstemp` (0600); before the rename it gets the mode the user's umask gives a new file (0644 under
umask 022), as `open` would. A process killed between the two leaves its temporary file: the next write of the
same target removes what earlier writers left (`leftovers`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["leftovers", "write_atomic"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_MODE = 0o666 & ~_umask()  # read once: os.umask can only be read by setting it


def write_atomic(path: str | os.PathLike[str], write: Callable[[str], None]) -> None:
    """`write(temporary path)`, then rename it to `path` (made with its folder); nothing at `path` on failure."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in leftovers(target):
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _MODE)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def leftovers(target: Path) -> list[Path]:
    """Temporary files an interrupted write of `target` left beside it."""
    if not target.parent.is_dir():
        return []
    return [path for path in target.parent.glob(f".{target.name}.*") if len(path.name) == len(target.name) + 10]
