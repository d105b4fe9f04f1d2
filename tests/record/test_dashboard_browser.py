"""A real browser on the real dashboard: ``primus-optuna dashboard`` on a study recorded by ``primus-optuna
run``, the trial page opened in headless Chromium (Debian package ``chromium``, installed by
scripts/services.sh), the rendered page shows the trial note's rationale and estimate.

Skipped, with the reason printed, where Chromium is not installed (scripts/install_chromium.sh says why).
scripts/dashboard_screenshot.sh uses the same install path and flags.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
import yaml

from primus_optuna.record.report.doc import fmt_tok
from tests.conftest import ROOT, small_moe_study

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (apt-get install chromium; scripts/services.sh installs it in CI)",
)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=15000"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _cli(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; from primus_optuna.cli import main; main(sys.argv[1:])", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_trial_page_shows_the_note_in_a_real_browser(tmp_path):
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(small_moe_study()))
    url = f"sqlite:///{tmp_path / 'd.db'}"
    run = _cli("run", str(study_file), "--storage", url, "--n-trials", "3", "--no-progress", cwd=tmp_path)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 0, out
    trial = optuna.load_study(study_name="small-moe", storage=url).trials[0]
    rationale = str(trial.user_attrs["rationale"])
    estimate = f"tokens/s/GPU estimated: {fmt_tok(float(trial.user_attrs['estimate_tokens_per_s_per_gpu']))}"

    port = _free_port()
    dash = _cli("dashboard", "--storage", url, "--port", str(port), cwd=tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(150):
            try:
                sid = _get(f"{base}/api/studies")["study_summaries"][0]["study_id"]
                break
            except OSError:
                if dash.poll() is not None:
                    raise AssertionError(dash.communicate()[0]) from None
                time.sleep(0.2)
        else:
            raise AssertionError("the dashboard did not start")
        page = f"{base}/dashboard/studies/{sid}/trials?numbers={trial.number}"
        dom = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'chrome'}", "--dump-dom", page],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        dash.terminate()
        dash.wait(timeout=30)
    html = dom.stdout
    assert dom.returncode == 0 and "<html" in html, dom.stderr[-2000:]
    assert "Rationale" in html and rationale in html, html[-3000:]
    assert estimate in html
