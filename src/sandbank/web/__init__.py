"""The browser UI: the page at `/` and its static files, using the interpreter API alone."""

from sandbank.web.site import csp, site

__all__ = ["csp", "site"]
