"""Provider keys: OS keyring, explicit 0600 file backend, pi import, and the CLI."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import keyring.errors
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail
from keyring.compat.properties import classproperty

from piwork.auth import (
    InsecureKeyFileError,
    KeyStore,
    KeyStoreError,
    NoKeyringError,
    import_pi_auth,
)
from piwork.cli.main import main
from piwork.config import Paths, get_paths

SECRET = "sk-live-SECRET-value-1234567890"


class MemoryKeyring(KeyringBackend):
    """A keyring backend that forgets everything when the test ends."""

    @classproperty
    def priority(cls) -> float:
        # Not "viable": keyring must never pick this class on its own in
        # other tests; here it is always passed in explicitly.
        raise RuntimeError("test-only keyring backend")

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.items: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.items.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.items[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        if self.items.pop((service, username), None) is None:
            raise keyring.errors.PasswordDeleteError("not found")


def no_keyring() -> KeyringBackend:
    """What keyring picks on a headless box with no Secret Service."""
    return fail.Keyring()  # type: ignore[no-untyped-call]


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    return get_paths()


@pytest.fixture
def memory() -> MemoryKeyring:
    return MemoryKeyring()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- OS keyring -------------------------------------------------------------------


def test_keyring_roundtrip_and_list_never_shows_values(paths: Paths, memory: MemoryKeyring) -> None:
    store = KeyStore(paths=paths, keyring_backend=memory)
    stored = store.set("anthropic", f"  {SECRET}\n")
    assert stored.backend == "keyring"
    assert memory.items[("piwork", "anthropic")] == SECRET  # stripped, service "piwork"
    assert store.get("anthropic") == SECRET
    assert store("anthropic") == SECRET  # usable as the gateway's KeyProvider
    listed = store.list()
    assert [(k.provider, k.backend) for k in listed] == [("anthropic", "keyring")]
    assert SECRET not in repr(listed)
    # the index remembers names only
    assert SECRET not in store.index_file.read_text()
    assert not store.keys_file.exists()
    assert store.delete("anthropic") is True
    assert store.get("anthropic") is None
    assert store.list() == []
    assert store.delete("anthropic") is False


def test_no_keyring_means_a_clear_error_and_no_plaintext(paths: Paths) -> None:
    store = KeyStore(paths=paths, keyring_backend=no_keyring())
    assert not store.keyring_available
    with pytest.raises(NoKeyringError) as err:
        store.set("openai", SECRET)
    assert "--file-backend" in str(err.value)
    assert "fileBackend" in str(err.value)
    assert not store.keys_file.exists()
    assert store.get("openai") is None  # reading with no keyring is not an error


def test_keyring_failure_is_a_readable_error(paths: Paths, memory: MemoryKeyring) -> None:
    class Locked(MemoryKeyring):
        def get_password(self, service: str, username: str) -> str | None:
            raise keyring.errors.KeyringLocked("collection is locked")

    with pytest.raises(KeyStoreError, match="collection is locked"):
        KeyStore(paths=paths, keyring_backend=Locked()).get("openai")


# --- the opt-in file backend -------------------------------------------------------


def test_file_backend_is_0600_and_works(paths: Paths) -> None:
    store = KeyStore(paths=paths, keyring_backend=no_keyring(), file_backend=True)
    stored = store.set("openai", SECRET)
    assert stored.backend == "file"
    assert stored.location == str(store.keys_file)
    assert _mode(store.keys_file) == 0o600
    # a later store without the flag still reads the file it was given
    plain = KeyStore(paths=paths, keyring_backend=no_keyring())
    assert plain.get("openai") == SECRET
    assert [(k.provider, k.backend) for k in plain.list()] == [("openai", "file")]
    store.set("google", "g-key")
    assert _mode(store.keys_file) == 0o600
    assert store.delete("openai")
    assert json.loads(store.keys_file.read_text()) == {"keys": {"google": "g-key"}}


def test_file_backend_refuses_a_file_others_can_read(paths: Paths) -> None:
    store = KeyStore(paths=paths, keyring_backend=no_keyring(), file_backend=True)
    store.set("openai", SECRET)
    os.chmod(store.keys_file, 0o644)
    with pytest.raises(InsecureKeyFileError) as err:
        store.get("openai")
    assert "chmod 600" in str(err.value)
    with pytest.raises(InsecureKeyFileError):
        store.list()


def test_settings_opt_in_enables_file_backend(paths: Paths) -> None:
    paths.config.mkdir(parents=True, exist_ok=True)
    paths.settings_file.write_text(json.dumps({"auth": {"fileBackend": True}}))
    store = KeyStore(paths=paths, keyring_backend=no_keyring())
    assert store.set("openai", SECRET).backend == "file"


def test_moving_a_key_between_backends_leaves_one_copy(paths: Paths, memory: MemoryKeyring) -> None:
    store = KeyStore(paths=paths, keyring_backend=memory)
    store.set("openai", "old", file_backend=True)
    store.set("openai", SECRET)  # into the keyring: the file copy goes
    assert json.loads(store.keys_file.read_text()) == {"keys": {}}
    assert [(k.provider, k.backend) for k in store.list()] == [("openai", "keyring")]
    store.set("openai", "newer", file_backend=True)  # and back
    assert memory.items == {}
    assert store.get("openai") == "newer"


# --- import from pi -----------------------------------------------------------------


def test_import_pi_auth(
    paths: Paths, memory: MemoryKeyring, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_OPENROUTER_KEY", "or-from-env")
    auth = tmp_path / "auth.json"
    auth.write_text(
        json.dumps(
            {
                "anthropic": {"type": "api_key", "key": SECRET},
                "openrouter": {"type": "api_key", "key": "MY_OPENROUTER_KEY"},
                "google": {"type": "api_key", "key": "!op read op://vault/google"},
                "openai": {"type": "oauth", "access": "a", "refresh": "r", "expires": 1},
                "mistral": {"type": "api_key", "key": "already-here"},
            }
        )
    )
    store = KeyStore(paths=paths, keyring_backend=memory)
    store.set("mistral", "kept")
    results = {r.provider: r for r in import_pi_auth(auth, store=store)}
    assert results["anthropic"].imported and store.get("anthropic") == SECRET
    assert results["openrouter"].imported and store.get("openrouter") == "or-from-env"
    assert not results["google"].imported and "shell command" in results["google"].reason
    assert not results["openai"].imported and "OAuth" in results["openai"].reason
    assert not results["mistral"].imported and store.get("mistral") == "kept"
    assert SECRET not in repr(results)
    again = {r.provider: r for r in import_pi_auth(auth, store=store, overwrite=True)}
    assert again["mistral"].imported and store.get("mistral") == "already-here"


def test_import_pi_auth_missing_file(paths: Paths, memory: MemoryKeyring, tmp_path: Path) -> None:
    with pytest.raises(KeyStoreError, match="no pi auth file"):
        import_pi_auth(tmp_path / "nope.json", store=KeyStore(paths=paths, keyring_backend=memory))


# --- CLI ------------------------------------------------------------------------------


@pytest.fixture
def cli_keyring(memory: MemoryKeyring, monkeypatch: pytest.MonkeyPatch) -> MemoryKeyring:
    monkeypatch.setattr(keyring, "get_keyring", lambda: memory)
    return memory


def test_cli_set_from_stdin_list_rm(
    paths: Paths,
    cli_keyring: MemoryKeyring,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(SECRET + "\n"))
    assert main(["auth", "set", "openai", "--stdin"]) == 0
    assert cli_keyring.items[("piwork", "openai")] == SECRET
    assert SECRET not in capsys.readouterr().out
    assert main(["auth", "list", "--json"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    listed = json.loads(out)
    assert listed == [
        {"provider": "openai", "backend": "keyring", "location": listed[0]["location"]}
    ]
    assert main(["auth", "rm", "openai"]) == 0
    assert main(["auth", "rm", "openai"]) == 1
    assert "no key" in capsys.readouterr().err


def test_cli_without_keyring_names_the_opt_in(
    paths: Paths, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(keyring, "get_keyring", no_keyring)
    monkeypatch.setattr("sys.stdin", io.StringIO(SECRET))
    assert main(["auth", "set", "openai", "--stdin"]) == 1
    err = capsys.readouterr().err
    assert "--file-backend" in err and "Traceback" not in err
    monkeypatch.setattr("sys.stdin", io.StringIO(SECRET))
    assert main(["auth", "set", "openai", "--stdin", "--file-backend"]) == 0
    assert _mode(paths.config / "keys.json") == 0o600
    assert SECRET not in capsys.readouterr().out


def test_cli_prompt_does_not_echo(
    paths: Paths,
    cli_keyring: MemoryKeyring,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prompts: list[str] = []

    def fake_getpass(prompt: str = "") -> str:
        prompts.append(prompt)
        return SECRET

    monkeypatch.setattr("getpass.getpass", fake_getpass)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    assert main(["auth", "set", "anthropic"]) == 0
    assert prompts and "anthropic" in prompts[0]
    assert SECRET not in capsys.readouterr().out


def test_cli_import_pi(
    paths: Paths, cli_keyring: MemoryKeyring, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"anthropic": {"type": "api_key", "key": SECRET}}))
    assert main(["auth", "import-pi", str(auth)]) == 0
    out = capsys.readouterr().out
    assert "anthropic" in out and SECRET not in out
    assert cli_keyring.items[("piwork", "anthropic")] == SECRET
