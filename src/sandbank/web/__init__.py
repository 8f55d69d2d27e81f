"""The browser UI: static files at `/` that use the interpreter API alone."""

from sandbank.web.site import csp, site

__all__ = ["csp", "site"]
