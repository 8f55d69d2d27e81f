"""Suite-wide guards: no test reaches a real LLM, and every sandbox uses test-sized limits."""

from __future__ import annotations

import os

# Set before any Settings is built (SANDBANK_TEST_REAL_LLM=1 lifts it for the opt-in test).
os.environ["SANDBANK_LLM_OFFLINE"] = "1"
