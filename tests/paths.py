"""The repository's paths, defined once for every test and test helper."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # tests/: conftest.py and the shared helper modules
ROOT = TESTS.parent  # the repository root
DOCS = ROOT / "docs"
