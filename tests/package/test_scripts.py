"""Every script under scripts/ that docs/benchmarks.md runs still imports and parses its arguments (``--help``):
a refactor of the package cannot leave a benchmark or check broken until its next run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
NEEDS_EXTRA = {"gguf_to_f32.py": "the gguf package, installed only to convert a model file"}


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.py") if p.name not in NEEDS_EXTRA))
def test_script_imports_and_takes_help(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout.lower(), done.stdout[:500]
