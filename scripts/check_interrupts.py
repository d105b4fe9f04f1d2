"""Ctrl-C at random moments of ``primus-optuna run`` on the analytical runner: each run must exit 130, print
no traceback and leave no trial RUNNING.

    python scripts/check_interrupts.py [--runs 14] [--seed 3] [--study studies/mixtral-8x22b-mi355x-fp8.yaml]
                                       [--after 0.3 9] [--program .venv/bin/primus-optuna]

Each run starts ``run STUDY --storage sqlite:///<fresh dir>/s.db --n-trials 80 --no-llm`` and sends SIGINT after a
uniform random delay (seconds) from ``--after``; the delays come from ``--seed``. Prints one line per run and
the count of bad ones. A signal within the first ~0.5 s lands in Python's own imports (a traceback by Python,
before any of the program runs).
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[1]


def one_run(program: str, study: Path, delay: float) -> tuple[bool, str]:
    """Interrupt one run after ``delay`` seconds; ``(ok, line)``."""
    work = Path(tempfile.mkdtemp(prefix="po-int-"))
    url = f"sqlite:///{work / 's.db'}"
    argv = [program, "run", str(study), "--storage", url, "--n-trials", "80", "--no-llm"]
    proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    traceback = "Traceback" in out or "Traceback" in err
    names = [s.study_name for s in optuna.get_all_study_summaries(url)] if (work / "s.db").exists() else []
    trials = optuna.load_study(study_name=names[0], storage=url).trials if names else []
    running = [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    ok = proc.returncode == 128 + signal.SIGINT and not traceback and not running
    line = (
        f"after {delay:5.2f} s: exit {proc.returncode}, {len(trials)} trials, running {running or 'none'}, "
        f"traceback {'yes' if traceback else 'no'}" + ("" if ok else "  <- BAD")
    )
    return ok, line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=14)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--study", type=Path, default=ROOT / "studies" / "mixtral-8x22b-mi355x-fp8.yaml")
    ap.add_argument("--after", type=float, nargs=2, default=(0.3, 9.0), metavar=("MIN_S", "MAX_S"))
    ap.add_argument("--program", default=str(Path(sys.executable).with_name("primus-optuna")))
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rng = random.Random(args.seed)
    bad = 0
    for _ in range(args.runs):
        ok, line = one_run(args.program, args.study.resolve(), rng.uniform(*args.after))
        bad += not ok
        print(line, flush=True)
    print(f"bad: {bad} of {args.runs}")


if __name__ == "__main__":
    main()
