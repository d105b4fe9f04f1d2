"""A stand-in training job for the ``command`` runner of the scale and fault tests.

    job.py CTL TRIAL TP PP MBS RECOMPUTE

Writes ``CTL/launch-<trial>-<pid>`` (its configuration), waits while ``CTL/hold-<trial>`` or ``CTL/hold-all``
exists (so a test can kill its worker mid-trial), then prints three Megatron-style iteration lines whose
throughput is a fixed function of the configuration. On SIGINT/SIGTERM it writes ``CTL/stopped-<trial>-<SIGNAL>``
after 0.3 s (a launcher stopping its workers) and exits.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    ctl, trial = Path(argv[0]), argv[1]
    tp, pp, mbs, recompute = int(argv[2]), int(argv[3]), int(argv[4]), argv[5]
    (ctl / f"launch-{trial}-{os.getpid()}").write_text(" ".join(argv[2:]))

    def stop(signum: int, frame: object) -> None:  # like torchrun: takes a moment to stop its workers
        time.sleep(0.3)
        (ctl / f"stopped-{trial}-{signal.Signals(signum).name}").write_text("")
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while (ctl / f"hold-{trial}").exists() or (ctl / "hold-all").exists():
        time.sleep(0.02)
    tps = 1000.0 + 40 * mbs - 15 * tp - 10 * pp - (120 if recompute == "full" else 0)
    for i in (1, 2, 3):
        print(
            f" iteration {i}/ 3 | elapsed time per iteration (ms): 100.0 | tokens per GPU (tokens/s/GPU): {tps} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
