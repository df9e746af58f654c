"""Errors raised while building, finding or checking runtime packs."""

from __future__ import annotations

from piwork import errors


class PackError(errors.PackError):
    """A pack could not be built, found or trusted; the message says what to do."""


class PinUnavailableError(PackError):
    """A pinned Debian package version can no longer be downloaded."""


class ManifestError(PackError):
    """A pack's ``manifest.json`` is missing, unreadable or does not validate."""
