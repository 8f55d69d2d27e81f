"""Where the interpreter's sandboxes come from: one `Sandboxes` interface, local or remote."""

from __future__ import annotations

from sandbank.config import Settings
from sandbank.sandbox.sessions import Runtime
from sandbank.workbench.base import FileEntry, Sandboxes

__all__ = ["FileEntry", "Sandboxes", "open_sandboxes"]


def open_sandboxes(settings: Settings, runtime: Runtime) -> Sandboxes:
    """The remote client when `sandbox_url` is set, else this server's runtime in-process."""
    if settings.sandbox_url:
        from sandbank.workbench.remote import RemoteSandboxes

        return RemoteSandboxes(settings)
    from sandbank.workbench.local import LocalSandboxes

    return LocalSandboxes(runtime, settings)
