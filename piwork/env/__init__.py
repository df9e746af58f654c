"""Task environments: the writable layer of the guest's workbench (see ``store``)."""

from piwork.env.store import (
    DEFAULT_SIZE_BYTES,
    ENV_DISK,
    EnvBusy,
    EnvError,
    EnvStore,
    FolderEnv,
    Layer,
    TaskEnv,
    allocated_bytes,
    default_store,
    store_for,
)

__all__ = [
    "DEFAULT_SIZE_BYTES",
    "ENV_DISK",
    "EnvBusy",
    "EnvError",
    "EnvStore",
    "FolderEnv",
    "Layer",
    "TaskEnv",
    "allocated_bytes",
    "default_store",
    "store_for",
]
