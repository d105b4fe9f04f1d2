"""Ctrl-C (or ``--signal TERM``) at random moments of ``primus-optuna run`` on the analytical runner: each run
must exit 128 + the signal (130, 143), print no traceback and leave no trial RUNNING.

    python scripts/check_interrupts.py [--runs 14] [--seed 3] [--study studies/mixtral-8x22b-mi355x-fp8.yaml]
                                       [--after 0.3 9] [--signal INT] [--then TERM [--gap 0.1]]
                                       [--program .venv/bin/primus-optuna]

Each run starts ``run STUDY --storage sqlite:///<fresh dir>/s.db --n-trials 80 --no-llm`` and sends the signal
after a uniform random delay (seconds) from ``--after``; the delays come from ``--seed``. ``--then``: a second
signal ``--gap`` s after the first (if the run is still going); the exit code must still be the first
signal's. Prints one line per run and the count of bad ones. A signal within the first ~0.5 s lands in
Python's own imports (a traceback by Python, before any of the program runs). The runs get SIGINT's default
action even when this script runs as a background job of a non-interactive shell (which starts it with
SIGINT ignored, and a run would inherit that: an early Ctrl-C lost, the run going on to exit 0).
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


def one_run(
    program: str, study: Path, delay: float, sig: signal.Signals, then: signal.Signals | None, gap: float
) -> tuple[bool, str]:
    """Interrupt one run with ``sig`` after ``delay`` seconds (and ``then`` ``gap`` s later); ``(ok, line)``."""
    work = Path(tempfile.mkdtemp(prefix="po-int-"))
    url = f"sqlite:///{work / 's.db'}"
    argv = [program, "run", str(study), "--storage", url, "--n-trials", "80", "--no-llm"]
    proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(sig)
    if then is not None:
        time.sleep(gap)
        if proc.poll() is None:
            proc.send_signal(then)
    out, err = proc.communicate(timeout=300)
    traceback = "Traceback" in out or "Traceback" in err
    names = [s.study_name for s in optuna.get_all_study_summaries(url)] if (work / "s.db").exists() else []
    trials = optuna.load_study(study_name=names[0], storage=url).trials if names else []
    running = [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    ok = proc.returncode == 128 + sig and not traceback and not running
    line = (
        f"after {delay:5.2f} s: exit {proc.returncode}, {len(trials)} trials, running {running or 'none'}, "
        f"traceback {'yes' if traceback else 'no'}" + ("" if ok else "  <- BAD")
    )
    last = [x for x in err.splitlines() if x.strip()][-1:]
    if not ok and last:  # e.g. the exception of a traceback
        line += f" ({last[0].strip()[:160]})"
    return ok, line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=14)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--study", type=Path, default=ROOT / "studies" / "mixtral-8x22b-mi355x-fp8.yaml")
    ap.add_argument("--after", type=float, nargs=2, default=(0.3, 9.0), metavar=("MIN_S", "MAX_S"))
    ap.add_argument("--signal", choices=("INT", "TERM"), default="INT", help="the signal sent (default: INT)")
    ap.add_argument("--then", choices=("INT", "TERM"), default=None, help="a second signal, --gap s later")
    ap.add_argument("--gap", type=float, default=0.1, help="seconds between the two signals (default: 0.1)")
    ap.add_argument("--program", default=str(Path(sys.executable).with_name("primus-optuna")))
    args = ap.parse_args()
    sig = signal.Signals[f"SIG{args.signal}"]
    then = signal.Signals[f"SIG{args.then}"] if args.then else None
    # a handled signal is reset to its default action in the runs (exec); an ignored one would stay ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rng = random.Random(args.seed)
    bad = 0
    for _ in range(args.runs):
        ok, line = one_run(args.program, args.study.resolve(), rng.uniform(*args.after), sig, then, args.gap)
        bad += not ok
        print(line, flush=True)
    print(f"bad: {bad} of {args.runs}")


if __name__ == "__main__":
    main()
