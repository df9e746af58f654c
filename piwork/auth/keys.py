"""Provider API keys, kept on the host: the OS keyring, or an opt-in 0600 file.

Keys are read only by the model gateway, which adds them to requests on their
way out; they never enter the VM. The store holds one secret per provider
name (``anthropic``, ``openai``, ...) under the keyring service ``piwork``.

A headless Linux box often has no keyring backend at all. Then storing a key
fails with a message naming the explicit opt-in (``--file-backend`` or the
``auth.fileBackend`` setting), which keeps keys in ``<config>/keys.json``
with mode 0600. There is never a silent plaintext fallback, and a key file
whose mode lets anyone else read it is refused rather than used.

Keyrings cannot enumerate their entries, so the names (never the values) of
keys put in the keyring are remembered in ``<config>/keyring-index.json``
for ``piwork auth list``.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import keyring
import keyring.errors
import orjson
from keyring.backend import KeyringBackend

from piwork.config import Paths, get_paths
from piwork.errors import PersonError
from piwork.fsutil import atomic_write_bytes
from piwork.settings import read_section

SERVICE_NAME = "piwork"
KEYS_FILE_NAME = "keys.json"
INDEX_FILE_NAME = "keyring-index.json"
FILE_BACKEND_SETTING = "auth.fileBackend"

Backend = Literal["keyring", "file"]


class KeyStoreError(PersonError):
    """A key could not be stored or read; the message says what to do."""


class NoKeyringError(KeyStoreError):
    """No OS keyring here, and the file backend was not opted into."""


class InsecureKeyFileError(KeyStoreError):
    """The key file is readable by others: refuse it rather than use it."""


@dataclass(frozen=True)
class StoredKey:
    """A stored key, without its value."""

    provider: str
    backend: Backend
    location: str
    """Human-readable: the keyring backend's name, or the key file's path."""


def _keyring_is_usable(backend: KeyringBackend) -> bool:
    """False for keyring's placeholder backends (nothing would be stored)."""
    from keyring.backends import chainer, fail, null

    if isinstance(backend, fail.Keyring | null.Keyring):
        return False
    if isinstance(backend, chainer.ChainerBackend):
        return any(_keyring_is_usable(b) for b in backend.backends)
    return True


def _backend_name(backend: KeyringBackend) -> str:
    name = getattr(backend, "name", None)
    return f"OS keyring ({name})" if isinstance(name, str) else "OS keyring"


def _read_json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def file_backend_enabled_in_settings(paths: Paths) -> bool:
    """``{"auth": {"fileBackend": true}}`` in settings.json opts in for good."""
    return read_section("auth", paths.settings_file).get("fileBackend") is True


class KeyStore:
    """Provider keys by name. Construct per use; it holds no secrets itself.

    ``file_backend=True`` is the explicit opt-in to the 0600 key file (the
    CLI's ``--file-backend``); ``None`` means "whatever settings.json says".
    ``keyring_backend`` replaces the OS keyring (tests).
    """

    def __init__(
        self,
        *,
        paths: Paths | None = None,
        file_backend: bool | None = None,
        keyring_backend: KeyringBackend | None = None,
    ) -> None:
        self._paths = paths or get_paths()
        self._file_opt_in = (
            file_backend
            if file_backend is not None
            else file_backend_enabled_in_settings(self._paths)
        )
        self._keyring = keyring_backend or keyring.get_keyring()

    # --- where things live --------------------------------------------------

    @property
    def keys_file(self) -> Path:
        return self._paths.config / KEYS_FILE_NAME

    @property
    def index_file(self) -> Path:
        return self._paths.config / INDEX_FILE_NAME

    @property
    def keyring_available(self) -> bool:
        return _keyring_is_usable(self._keyring)

    @property
    def file_backend_opted_in(self) -> bool:
        return self._file_opt_in

    def _no_keyring_error(self) -> NoKeyringError:
        return NoKeyringError(
            "No OS keyring is available here (common on headless Linux: no Secret "
            "Service / KWallet on D-Bus). piwork will not store keys in plain files "
            "unless you ask it to: re-run with `piwork auth set PROVIDER --file-backend` "
            f'(or set {{"auth": {{"fileBackend": true}}}} in {self._paths.settings_file}) '
            f"to keep keys in {self.keys_file}, readable only by you (mode 0600)."
        )

    # --- the key file ---------------------------------------------------------

    def _load_file(self) -> dict[str, str]:
        path = self.keys_file
        try:
            st = path.stat()
        except FileNotFoundError:
            return {}
        if os.name != "nt" and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise InsecureKeyFileError(
                f"{path} has mode {stat.S_IMODE(st.st_mode):04o}, so other users may read "
                f"it; piwork will not use it. Fix it with `chmod 600 {path}` "
                "(and consider rotating the keys it holds)."
            )
        if os.name != "nt" and hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise InsecureKeyFileError(f"{path} belongs to another user; piwork will not use it.")
        try:
            data = _read_json(path)
        except orjson.JSONDecodeError as exc:
            raise KeyStoreError(f"{path} is not valid JSON ({exc}); fix or remove it") from exc
        keys = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(keys, dict):
            raise KeyStoreError(f'{path} must look like {{"keys": {{"PROVIDER": "KEY"}}}}')
        return {str(k): str(v) for k, v in keys.items() if isinstance(v, str) and v}

    def _save_file(self, keys: dict[str, str]) -> None:
        atomic_write_bytes(self.keys_file, orjson.dumps({"keys": keys}, option=orjson.OPT_INDENT_2))

    # --- the keyring name index -------------------------------------------

    def _load_index(self) -> list[str]:
        try:
            data = _read_json(self.index_file)
        except (OSError, orjson.JSONDecodeError):
            return []
        names = data.get("providers") if isinstance(data, dict) else None
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    def _save_index(self, names: list[str]) -> None:
        payload = {"providers": sorted(set(names)), "note": "names only; values are in the keyring"}
        atomic_write_bytes(self.index_file, orjson.dumps(payload, option=orjson.OPT_INDENT_2))

    # --- keyring calls, with readable errors --------------------------------

    def _kr_get(self, provider: str) -> str | None:
        try:
            value = self._keyring.get_password(SERVICE_NAME, provider)
        except keyring.errors.KeyringError as exc:
            raise KeyStoreError(f"the OS keyring refused to read {provider!r}: {exc}") from exc
        return value if isinstance(value, str) and value else None

    def _kr_set(self, provider: str, value: str) -> None:
        try:
            self._keyring.set_password(SERVICE_NAME, provider, value)
        except keyring.errors.KeyringError as exc:
            raise KeyStoreError(f"the OS keyring refused to store {provider!r}: {exc}") from exc

    def _kr_delete(self, provider: str) -> bool:
        try:
            self._keyring.delete_password(SERVICE_NAME, provider)
        except keyring.errors.PasswordDeleteError:
            return False
        except keyring.errors.KeyringError as exc:
            raise KeyStoreError(f"the OS keyring refused to delete {provider!r}: {exc}") from exc
        return True

    # --- public API -----------------------------------------------------------

    def set(self, provider: str, value: str, *, file_backend: bool | None = None) -> StoredKey:
        """Store ``value`` for ``provider``, replacing any earlier key (in either backend)."""
        value = value.strip()
        if not value:
            raise KeyStoreError("refusing to store an empty key")
        if not provider or any(c.isspace() or c == "/" for c in provider):
            raise KeyStoreError(f"invalid provider name {provider!r}")
        use_file = self._file_opt_in if file_backend is None else file_backend
        self.ensure_writable(file_backend=use_file)
        if use_file:
            keys = self._load_file()
            keys[provider] = value
            self._save_file(keys)
            if self.keyring_available:
                self._kr_delete(provider)
            self._forget_in_index(provider)
            return StoredKey(provider, "file", str(self.keys_file))
        self._kr_set(provider, value)
        self._save_index([*self._load_index(), provider])
        self._remove_from_file(provider)
        return StoredKey(provider, "keyring", _backend_name(self._keyring))

    def ensure_writable(self, *, file_backend: bool | None = None) -> None:
        """Raise :class:`NoKeyringError` now if :meth:`set` could not store a key.

        Lets a front end fail before asking the person to paste a secret.
        """
        use_file = self._file_opt_in if file_backend is None else file_backend
        if not use_file and not self.keyring_available:
            raise self._no_keyring_error()

    def get(self, provider: str) -> str | None:
        """The key for ``provider``, or None. The gateway's ``KeyProvider``."""
        if self.keyring_available:
            value = self._kr_get(provider)
            if value is not None:
                return value
        return self._load_file().get(provider)

    __call__ = get

    def where(self, provider: str) -> StoredKey | None:
        """Where ``provider``'s key is stored, without returning the value."""
        if self.keyring_available and self._kr_get(provider) is not None:
            return StoredKey(provider, "keyring", _backend_name(self._keyring))
        if provider in self._load_file():
            return StoredKey(provider, "file", str(self.keys_file))
        return None

    def delete(self, provider: str) -> bool:
        """Remove ``provider``'s key from every backend; False if there was none."""
        removed = False
        if self.keyring_available:
            removed = self._kr_delete(provider)
        self._forget_in_index(provider)
        return self._remove_from_file(provider) or removed

    def list(self) -> list[StoredKey]:
        """Stored keys: names and where they live, never values."""
        out: dict[str, StoredKey] = {}
        if self.keyring_available:
            for name in self._load_index():
                if self._kr_get(name) is not None:
                    out[name] = StoredKey(name, "keyring", _backend_name(self._keyring))
        for name in self._load_file():
            out.setdefault(name, StoredKey(name, "file", str(self.keys_file)))
        return [out[name] for name in sorted(out)]

    def _forget_in_index(self, provider: str) -> None:
        names = self._load_index()
        if provider in names:
            self._save_index([n for n in names if n != provider])

    def _remove_from_file(self, provider: str) -> bool:
        if not self.keys_file.exists():
            return False
        keys = self._load_file()
        if provider not in keys:
            return False
        del keys[provider]
        self._save_file(keys)
        return True


# --- importing from pi ------------------------------------------------------


@dataclass(frozen=True)
class ImportResult:
    provider: str
    imported: bool
    reason: str
    """Why not, or where it went: printed as is."""


def default_pi_auth_path() -> Path:
    """pi's ``auth.json``: ``$PI_CODING_AGENT_DIR/auth.json`` or ``~/.pi/agent/auth.json``."""
    agent_dir = os.environ.get("PI_CODING_AGENT_DIR")
    base = Path(agent_dir).expanduser() if agent_dir else Path.home() / ".pi" / "agent"
    return base / "auth.json"


def import_pi_auth(
    path: Path | None = None, *, store: KeyStore | None = None, overwrite: bool = False
) -> list[ImportResult]:
    """Copy API keys from pi's ``auth.json`` into the key store, once, on request.

    pi stores ``{PROVIDER: {"type": "api_key", "key": K} | {"type": "oauth", ...}}``;
    ``K`` is resolved as pi does: ``!command`` (not run here: skipped), the name
    of a set environment variable (its value), or the literal key. OAuth logins
    are skipped: their tokens expire and need pi's refresh logic.
    """
    path = path or default_pi_auth_path()
    store = store or KeyStore()
    try:
        data = _read_json(path)
    except FileNotFoundError as exc:
        raise KeyStoreError(f"no pi auth file at {path}") from exc
    except (OSError, orjson.JSONDecodeError) as exc:
        raise KeyStoreError(f"cannot read pi auth file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise KeyStoreError(f"{path} is not a JSON object of providers")
    results: list[ImportResult] = []
    for provider, cred in sorted(data.items()):
        if not isinstance(cred, dict):
            results.append(ImportResult(provider, False, "unrecognised entry"))
            continue
        kind = cred.get("type")
        if kind == "oauth":
            results.append(
                ImportResult(provider, False, "OAuth login (tokens expire); use an API key instead")
            )
            continue
        raw = cred.get("key")
        if kind != "api_key" or not isinstance(raw, str) or not raw.strip():
            results.append(ImportResult(provider, False, "unrecognised entry"))
            continue
        if raw.startswith("!"):
            results.append(
                ImportResult(provider, False, "key is a shell command; not run, set it by hand")
            )
            continue
        value = os.environ.get(raw) or raw
        if not overwrite and store.where(provider) is not None:
            results.append(ImportResult(provider, False, "already stored in piwork (kept)"))
            continue
        stored = store.set(provider, value)
        results.append(ImportResult(provider, True, f"stored in {stored.location}"))
    return results
