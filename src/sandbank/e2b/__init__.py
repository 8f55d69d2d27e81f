"""The E2B door: E2B's control plane, envd and code interpreter over the sandbox port, so the
E2B SDKs (Python and JS) run unchanged against Sandbank (README, "Using the E2B SDKs")."""
