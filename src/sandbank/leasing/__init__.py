"""Where the interpreter's sandboxes come from: one `Sandboxes` interface, local or remote."""

from __future__ import annotations

from sandbank.config import Settings
from sandbank.leasing.base import FileEntry, Sandboxes
from sandbank.sandbox.sessions import Runtime

__all__ = ["FileEntry", "Sandboxes", "open_sandboxes"]


def open_sandboxes(settings: Settings, runtime: Runtime) -> Sandboxes:
    """The remote client when `sandbox_url` is set, else this server's runtime in-process."""
    if settings.sandbox_url:
        from sandbank.leasing.remote import RemoteSandboxes

        return RemoteSandboxes(settings)
    from sandbank.leasing.local import LocalSandboxes

    return LocalSandboxes(runtime, settings)
