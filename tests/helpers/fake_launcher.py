"""A stand-in for a training launcher: replays recorded log lines or misbehaves on purpose.

usage: fake_launcher.py MODE [ARGS...]; MODE is replay FILE | oom | hang PIDFILE | crash | teardown | midway |
silent | echo | steps DELAY_S PIDFILE V1,V2,...[;W1,W2,...] | simulate STEP_S ITERS NOISE SEED TIME_SCALE
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "run" / "data"


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "replay":
        for line in (DATA / argv[1]).read_text().splitlines():
            print(line, flush=True)
        return 0
    if mode == "oom":
        print((DATA / "oom.log").read_text(), flush=True)
        return 1
    if mode == "hang":
        # a child in the same process group: the timeout must kill it too
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(argv[1]).write_text(str(child.pid))
        print(" iteration 1/ 10 | elapsed time per iteration (ms): 100.0 |", flush=True)
        time.sleep(600)
        return 0
    if mode == "crash":
        print("Traceback (most recent call last):\nValueError: bad launch configuration", flush=True)
        return 3
    if mode in ("teardown", "midway"):  # exits non-zero after all (teardown) or one (midway) of 3 iterations
        for i in range(1, 4 if mode == "teardown" else 2):
            print(
                f" iteration {i}/ 3 | elapsed time per iteration (ms): 10.0 | tokens per GPU (tokens/s/GPU): 7.0 |"
            )
        print("terminate called without an active exception", flush=True)
        return 134
    if (
        mode == "steps"
    ):  # one iteration line per value (tokens/s/GPU), DELAY_S apart, with a child in the group
        # V1,V2;W1,W2: one group per trial, chosen by PRIMUS_OPTUNA_TRIAL (the last group for later trials)
        import os

        groups = argv[3].split(";")
        n = int(os.environ.get("PRIMUS_OPTUNA_TRIAL") or 0)
        delay, pidfile = float(argv[1]), Path(argv[2])
        values = [float(v) for v in groups[min(n, len(groups) - 1)].split(",")]
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        pidfile.write_text(str(child.pid))
        for i, v in enumerate(values, 1):
            print(f" iteration {i}/ {len(values)} | tokens per GPU (tokens/s/GPU): {v:.1f} |", flush=True)
            time.sleep(delay)
        child.kill()
        return 0
    if (
        mode == "simulate"
    ):  # a job whose step time is STEP_S with relative noise NOISE, sleeping STEP_S×TIME_SCALE
        import random

        step, iters, noise, seed, scale = (
            float(argv[1]),
            int(argv[2]),
            float(argv[3]),
            int(argv[4]),
            float(argv[5]),
        )
        rng = random.Random(seed)
        for i in range(1, iters + 1):
            t = step * (1.5 if i <= 2 else 1.0) * max(0.5, rng.gauss(1.0, noise))  # two slower warm-up steps
            time.sleep(t * scale)
            print(f" iteration {i}/ {iters} | elapsed time per iteration (ms): {t * 1000:.1f} |", flush=True)
        return 0
    if mode == "silent":
        print("training finished, nothing logged", flush=True)
        return 0
    if mode == "echo":  # prints its argv and environment marker, one per line
        for a in argv[1:]:
            print(f"ARG {a}")
        import os

        print(f"ENV {os.environ.get('FAKE_TP', '')}")
        print(
            " iteration 3/ 3 | elapsed time per iteration (ms): 10.0 | tokens per GPU (tokens/s/GPU): 7.0 |"
        )
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
