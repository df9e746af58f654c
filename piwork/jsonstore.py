"""Files that hold a person's decisions: read strictly, written durably, a last good copy kept.

piwork keeps what a person decided in small JSON files: permission rules
(``policy.json``), settings (``settings.json``), remote hosts
(``hosts.json``), custom providers (``providers.json``), each folder's
environment (``envs/folders/<key>.json`` and the records it points at). One
rule holds for all of them: **a file piwork cannot read is never taken for an
empty one.** An empty policy is the built-in defaults, which allow what the
person denied; empty settings drop their limits; an empty environment record
lets the collector delete the layers a folder's tasks sit on.

So, for every such file:

* a write is durable: temp file, fsync, rename over, fsync the directory
  (:mod:`piwork.fsutil`), and the same bytes go to ``<name>.last-good``
  beside it; a read that parses refreshes ``<name>.last-good`` when the file
  changed by hand;
* a file that cannot be read, does not parse, is empty, or is missing while its
  last good copy is there, raises :class:`DamagedFile`: one line that names the
  file, says what is wrong, where a copy of the damaged bytes was kept
  (``<name>.damaged-<time>``) and the command that puts the last good copy
  back. The damaged file stays where it is, so every reader refuses it until
  the person restores or fixes it; nothing runs on a guess;
* :meth:`JsonFile.restore` puts the last good copy back (checked by the same
  parser first) and never replaces a file that is not damaged.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Generic, TypeVar

from piwork.errors import PersonError
from piwork.fsutil import atomic_write_bytes, fsync_dir

T = TypeVar("T")

_HELD = threading.local()
"""The lock files this thread holds (``JsonFile.locked`` is re-entrant per thread)."""

LAST_GOOD = ".last-good"
DAMAGED = ".damaged-"
MAX_BYTES = 16 << 20
"""No file of this kind is near this size; a bigger one is damage (and is not copied)."""
KEEP_DAMAGED = 5
"""Copies of damaged bytes kept per file (the oldest go first)."""

PARSE_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, KeyError)
"""What a parser raises for a file that is not what it should be (orjson's and pydantic's
errors are ValueErrors)."""
READ_ERRORS: tuple[type[Exception], ...] = (OSError, *PARSE_ERRORS)


class DamagedFile(PersonError):
    """A file holding a person's decisions cannot be used; ``str()`` is one line saying what
    is wrong, where the damaged bytes were kept, and how to restore the last good copy."""

    def __init__(
        self,
        what: str,
        path: Path,
        detail: str,
        *,
        kept: Path | None,
        last_good: Path | None,
        restore: str,
        fresh: str | None = None,
    ) -> None:
        self.what = what
        self.path = path
        self.detail = detail
        self.kept = kept
        self.last_good = last_good
        self.restore = restore
        parts = [f"the {what} {path} is damaged ({detail}), so nothing runs on it"]
        if kept is not None:
            parts.append(f"a copy of the damaged file is kept at {kept}")
        if last_good is not None:
            saved = _when(last_good)
            parts.append(
                f"`{restore}` puts back the last good copy ({last_good}{saved})"
                + " and keeps the damaged one"
            )
        else:
            parts.append("there is no earlier good copy: fix the file by hand")
            if fresh:
                parts[-1] += f", or {fresh}"
        super().__init__("; ".join(parts))


class NothingToRestore(PersonError):
    """``restore`` found no damage, or no usable last good copy."""


def _when(path: Path) -> str:
    try:
        stamp = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except OSError:
        return ""
    return f", saved {stamp:%Y-%m-%d %H:%M} UTC"


def _detail(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:299] + "…"


@dataclass(frozen=True)
class Restored:
    path: Path
    source: Path
    kept: Path | None
    """Where the damaged bytes that were in place are kept (None: nothing was there)."""


@dataclass(frozen=True)
class JsonFile(Generic[T]):
    """One decision file. ``parse`` turns its bytes into ``T`` or raises a ``PARSE_ERRORS``."""

    path: Path
    parse: Callable[[bytes], T]
    what: str
    """How the person knows it: "policy file", "settings file"."""
    restore_command: str
    """The command that restores it: ``piwork policy restore``."""
    fresh: str | None = None
    """What starts over without it, said after "or": ``run `piwork policy reset --yes```."""
    error: type[DamagedFile] = DamagedFile
    """The store's own subclass, so its callers can keep catching their error type."""
    keep_copies: bool = True
    """False for a file piwork only reads on the person's say (``run --policy FILE``): no
    last good copy and no copy of damage is written beside it."""

    @property
    def last_good(self) -> Path:
        return self.path.with_name(self.path.name + LAST_GOOD)

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    # ------------------------------------------------------------------ locking
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive advisory lock for a read-modify-write.

        Re-entrant within a thread (a read inside a read-modify-write of the same file
        would otherwise wait for itself: ``flock`` locks per open file). Without a way
        to make the lock file (a read-only directory) a read goes on unlocked: writes
        are atomic, so it still sees a whole file.
        """
        held: set[Path] = _HELD.__dict__.setdefault("paths", set())
        if self.lock_path in held:
            yield
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held.add(self.lock_path)
            try:
                yield
            finally:
                held.discard(self.lock_path)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ reading
    def _damaged(self, detail: str, raw: bytes | None) -> DamagedFile:
        kept = self._keep_damaged(raw) if raw is not None and self.keep_copies else None
        good = self.last_good if self.keep_copies and self._last_good_usable() else None
        return self.error(
            self.what,
            self.path,
            detail,
            kept=kept,
            last_good=good,
            restore=self.restore_command,
            fresh=self.fresh,
        )

    def _read_raw(self, path: Path) -> bytes:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES >> 20} MiB")
        return raw

    def _last_good_usable(self) -> bool:
        try:
            raw = self._read_raw(self.last_good)
            self.parse(raw)
        except READ_ERRORS:
            return False
        return bool(raw.strip())

    def read(self) -> T | None:
        """The parsed file, None if there is none (and no last good copy); raises DamagedFile.

        Not locked: call it inside :meth:`locked` for a read-modify-write, or use :meth:`load`.
        """
        try:
            raw = self._read_raw(self.path)
        except (FileNotFoundError, NotADirectoryError):
            if self.keep_copies and self.last_good.exists():
                raise self._damaged(
                    "it is missing, but its last good copy is beside it; if you removed it "
                    f"on purpose, remove {self.last_good.name} too",
                    None,
                ) from None
            return None
        except OSError as exc:
            raise self._damaged(f"cannot read it: {exc.strerror or exc}", None) from exc
        except ValueError as exc:  # too big
            raise self._damaged(_detail(exc), None) from exc
        if not raw.strip() and self.keep_copies and self.last_good.exists():
            raise self._damaged("it is empty", raw)
        try:
            value = self.parse(raw)
        except PARSE_ERRORS as exc:
            raise self._damaged(_detail(exc), raw) from exc
        self._refresh_last_good(raw)
        return value

    def load(self) -> T | None:
        with self.locked():
            return self.read()

    def check(self) -> DamagedFile | None:
        """The damage :meth:`load` would raise, or None when the file is usable (or absent)."""
        try:
            self.load()
        except DamagedFile as exc:
            return exc
        return None

    def _refresh_last_good(self, raw: bytes) -> None:
        """The file parsed: it is the last good copy now (best effort on a read)."""
        if not self.keep_copies:
            return
        try:
            if self.last_good.read_bytes() == raw:
                return
        except OSError:
            pass
        with contextlib.suppress(OSError):
            atomic_write_bytes(self.last_good, raw)

    def _keep_damaged(self, raw: bytes) -> Path | None:
        """A copy of the damaged bytes (once per content), so a restore or a fix loses nothing."""
        copies = self.damaged_copies()
        if copies:
            with contextlib.suppress(OSError):
                if copies[-1].read_bytes() == raw:
                    return copies[-1]
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        dest = self.path.with_name(f"{self.path.name}{DAMAGED}{stamp}")
        try:
            atomic_write_bytes(dest, raw)
        except OSError:
            return None
        for old in [*copies, dest][:-KEEP_DAMAGED]:
            with contextlib.suppress(OSError):
                old.unlink()
        return dest

    def damaged_copies(self) -> list[Path]:
        """Kept copies of damaged bytes, oldest first."""
        prefix = self.path.name + DAMAGED
        try:
            names = [p for p in self.path.parent.iterdir() if p.name.startswith(prefix)]
        except OSError:
            return []
        return sorted(names, key=lambda p: p.name)

    # ------------------------------------------------------------------ writing
    def write(self, data: bytes) -> None:
        """Replace the file and its last good copy durably (call inside :meth:`locked`)."""
        self.parse(data)  # never write what the reader would refuse
        # The copy first: if either write fails (a full disk) the file is the old one, the
        # caller sees the error, and the next read makes the copy match the file again.
        # Not before the first file, though: a crash between the two would leave a copy
        # beside no file, which reads as damage (the file gone); the file first, then.
        first = not self.path.exists()
        if self.keep_copies and not first:
            atomic_write_bytes(self.last_good, data)
        atomic_write_bytes(self.path, data)
        if self.keep_copies and first:
            atomic_write_bytes(self.last_good, data)

    def save(self, data: bytes) -> None:
        with self.locked():
            self.write(data)

    def remove(self) -> bool:
        """Forget the file and its last good copy (copies of damage stay); True if it was there.

        Not locked: call it inside :meth:`locked` (or the store's own lock).
        """
        found = False
        for path in (self.path, self.last_good):
            try:
                path.unlink()
                found = True
            except FileNotFoundError:
                pass
        fsync_dir(self.path.parent)
        return found

    def restore(self) -> Restored:
        """Put the last good copy back in place of a damaged (or missing) file."""
        with self.locked():
            damage: DamagedFile | None = None
            try:
                self.read()
            except DamagedFile as exc:
                damage = exc
            if damage is None:
                raise NothingToRestore(f"the {self.what} {self.path} is not damaged: nothing to do")
            try:
                raw = self._read_raw(self.last_good)
                self.parse(raw)
            except FileNotFoundError:
                raise NothingToRestore(
                    f"the {self.what} {self.path} has no last good copy to restore; "
                    "fix the file by hand" + (f", or {self.fresh}" if self.fresh else "")
                ) from None
            except READ_ERRORS as exc:
                raise NothingToRestore(
                    f"the last good copy {self.last_good} is damaged too ({_detail(exc)}); "
                    "fix the file by hand" + (f", or {self.fresh}" if self.fresh else "")
                ) from exc
            atomic_write_bytes(self.path, raw)
            return Restored(self.path, self.last_good, damage.kept)


__all__ = [
    "PARSE_ERRORS",
    "DamagedFile",
    "JsonFile",
    "NothingToRestore",
    "Restored",
]
