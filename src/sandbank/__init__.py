"""Sandbank: a self-hosted code interpreter with isolated, stateful sandboxes."""

__version__ = "0.1.0"
