"""Provider keys on the host (OS keyring or an opt-in 0600 file); never in the VM."""

from piwork.auth.keys import (
    ImportResult,
    InsecureKeyFileError,
    KeyStore,
    KeyStoreError,
    NoKeyringError,
    StoredKey,
    default_pi_auth_path,
    import_pi_auth,
)

__all__ = [
    "ImportResult",
    "InsecureKeyFileError",
    "KeyStore",
    "KeyStoreError",
    "NoKeyringError",
    "StoredKey",
    "default_pi_auth_path",
    "import_pi_auth",
]
