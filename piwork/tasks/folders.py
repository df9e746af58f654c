"""Which host folder a task may work in.

The working folder is mounted read-write into the VM, so the agent can change
anything under it. We therefore refuse folders where that would be a bad
surprise: system folders, the home folder as a whole, folders holding
credentials, and piwork's own data (which holds every task's transcript and
the permission policy). The check runs on the symlink-resolved path, so a link
to ``/etc`` is refused like ``/etc`` itself.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from piwork.config import get_paths
from piwork.errors import UsageError

#: Refused themselves, but a project folder *inside* them is fine.
_EXACT: tuple[str, ...] = (
    "/",
    "/home",
    "/Users",
    "/root",
    "/tmp",
    "/var",
    "/var/tmp",
    "/private",
    "/private/tmp",
    "/private/var",
    "/mnt",
    "/media",
    "/opt",
    "/srv",
    "/Volumes",
    "/nix",
    "/snap",
)

#: Refused with everything inside them.
_TREES: tuple[str, ...] = (
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/boot",
    "/efi",
    "/dev",
    "/proc",
    "/sys",
    "/run",
    "/var/lib",
    "/var/log",
    "/var/cache",
    "/var/run",
    "/var/spool",
    "/var/db",
    "/nix/store",
    # macOS
    "/System",
    "/Library",
    "/Applications",
    "/cores",
    "/private/etc",
    "/private/var/db",
    "/private/var/root",
)

_SETTINGS = (
    "holds your programs' settings and saved logins or tokens; the agent could read "
    "them or change how those programs behave"
)
_CREDENTIALS = "holds credentials (keys, tokens, certificates)"

#: Relative to the home folder, refused with everything inside them, and why.
_HOME_TREES: dict[str, str] = {
    ".ssh": _CREDENTIALS,
    ".gnupg": _CREDENTIALS,
    ".aws": _CREDENTIALS,
    ".azure": _CREDENTIALS,
    ".kube": _CREDENTIALS,
    ".docker": _CREDENTIALS,
    ".pki": _CREDENTIALS,
    ".password-store": _CREDENTIALS,
    ".cargo": _CREDENTIALS,
    ".mozilla": "holds your browser profile (saved passwords and cookies)",
    ".thunderbird": "holds your mail profile (saved passwords)",
    ".config": _SETTINGS,
    ".local": (
        "holds your programs' data and the commands in ~/.local/bin that your shell runs; "
        "the agent could plant or change them"
    ),
    "Library": _SETTINGS,
    "AppData": _SETTINGS,
}

#: XDG base directories that may live outside the home folder; same reasons.
_XDG_VARS: tuple[str, ...] = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")


class FolderError(ValueError, UsageError):
    """A folder that cannot be a task's working folder. ``str()`` is user-facing."""

    def __init__(self, path: Path, code: str, message: str) -> None:
        self.path = path
        self.code = code  # missing, not_dir, unreadable, system, home, secrets, piwork
        super().__init__(message)


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def _real(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path


def _piwork_dirs() -> list[Path]:
    paths = get_paths()
    return [paths.data, paths.config, paths.state, paths.cache]


def validate_working_folder(
    folder: str | os.PathLike[str],
    *,
    home: Path | None = None,
    protected: Iterable[Path] = (),
) -> Path:
    """Return the absolute, symlink-resolved folder, or raise :class:`FolderError`.

    ``protected`` adds folders (and their ancestors) to refuse, on top of
    piwork's own data, config, state and cache folders.
    """
    raw = Path(folder).expanduser()
    shown = raw if raw.is_absolute() else Path.cwd() / raw
    try:
        st = os.stat(shown)
    except FileNotFoundError:
        raise FolderError(shown, "missing", f"Working folder {shown} does not exist.") from None
    except PermissionError:
        raise FolderError(
            shown, "unreadable", f"Working folder {shown} cannot be accessed (permission denied)."
        ) from None
    except OSError as exc:
        raise FolderError(
            shown, "unreadable", f"Working folder {shown} cannot be accessed: {exc.strerror}."
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        kind = "a file" if stat.S_ISREG(st.st_mode) else "not a folder"
        raise FolderError(
            shown, "not_dir", f"Working folder {shown} is not a directory (it is {kind})."
        )

    path = shown.resolve(strict=True)
    via = "" if path == shown else f" ({shown} points there)"
    choose = " Choose a project folder instead, for example one inside your home folder."

    if path.parent == path or str(path) in _EXACT:
        raise FolderError(
            path,
            "system",
            f"Refusing {path}{via} as a working folder: it is a system folder.{choose}",
        )
    for tree in _TREES:
        if _inside(path, Path(tree)):
            raise FolderError(
                path,
                "system",
                f"Refusing {path}{via} as a working folder: it is a system folder ({tree})."
                f"{choose}",
            )

    home_dir = _real(home if home is not None else Path.home())
    if path == home_dir:
        raise FolderError(
            path,
            "home",
            f"Refusing {path}{via} as a working folder: it is your whole home folder, and the "
            "agent could change anything in it. Choose a project folder inside it.",
        )
    trees = [(home_dir / name, why) for name, why in _HOME_TREES.items()]
    trees += [(_real(Path(os.environ[v])), _SETTINGS) for v in _XDG_VARS if os.environ.get(v)]
    for held, why in trees:
        if _inside(path, held):
            raise FolderError(
                path,
                "secrets",
                f"Refusing {path}{via} as a working folder: {held} {why}, and the agent may "
                "change anything in its working folder. Choose a project folder instead.",
            )

    for own in [*_piwork_dirs(), *protected]:
        own_real = _real(own)
        if _inside(path, own_real) or _inside(own_real, path):
            raise FolderError(
                path,
                "piwork",
                f"Refusing {path}{via} as a working folder: it contains or is inside piwork's "
                f"own data ({own_real}), which holds every task's transcript and the policy.",
            )

    if not os.access(path, os.R_OK | os.X_OK):
        raise FolderError(
            path, "unreadable", f"Working folder {path} cannot be read (permission denied)."
        )
    return path
