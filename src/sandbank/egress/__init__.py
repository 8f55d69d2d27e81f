"""Controlled egress: per-session network policies and the filtering proxy that enforces them."""
