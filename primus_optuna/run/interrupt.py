"""Interrupts (Ctrl-C, ``kill -TERM``) of a study run: stop the launched jobs, record the trial, exit cleanly.

:func:`handle_signals` (used by ``primus-optuna run``) turns SIGINT and SIGTERM into :class:`Interrupted` (a
:class:`KeyboardInterrupt`) in the main thread and raises a process-wide stop flag that runners waiting for a
job in other threads (``--n-jobs``) poll with :func:`stop_signal`. A runner that is waiting for a job when
either happens forwards the signal to the job's process group and waits for it to end (``torchrun`` forwards
it to its workers): an interrupted study leaves no GPU busy. The objective then records the trial as FAIL with
``failure_reason: interrupted``; :func:`~primus_optuna.run.objective.requeue_interrupted` re-runs it first
when the study is resumed.

Example::

    with handle_signals():
        study.optimize(objective, n_trials=10)
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = [
    "OPTUNA_TELL_FUNCTION",
    "OPTUNA_TELL_MODULE",
    "STORAGE_PACKAGES",
    "Interrupted",
    "exit_code",
    "handle_signals",
    "raise_if_stopped",
    "reset_stop",
    "stop_signal",
]

# Where Optuna records a trial: ``_run_trial`` calls ``_tell_with_warning`` (optuna/study/_optimize.py@v5.1.0),
# which also runs the sampler's ``after_trial`` (optuna/study/_tell.py@v5.1.0). Private names: an Optuna
# release that renames them fails tests/run/test_interrupt.py, instead of silently letting an interrupt cut
# into tell (see :func:`_recording`).
OPTUNA_TELL_MODULE = "optuna.study._tell"
OPTUNA_TELL_FUNCTION = "_tell_with_warning"
STORAGE_PACKAGES = ("optuna.storages", "sqlalchemy")
"""packages a second signal is held out of: one cutting a storage write left its SQLite transaction open
(``database is locked`` at the next write, a trial left RUNNING), and SQLAlchemy's weakref callbacks swallow
it (``Exception ignored in ... _collection_gced``); seen with ``scripts/check_interrupts.py --then INT``"""

_stop = threading.Event()
_signum: list[int] = []


class Interrupted(KeyboardInterrupt):
    """The run was asked to stop by a signal (``signum``: SIGINT for Ctrl-C, SIGTERM for ``kill``)."""

    def __init__(self, signum: int = signal.SIGINT, *, log_path: str | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.log_path = log_path
        """the interrupted job's log, when a runner had started one"""


def stop_signal() -> int | None:
    """The signal that asked this process to stop, or ``None``."""
    return _signum[0] if _stop.is_set() and _signum else None


def request_stop(signum: int) -> None:
    """Raise the process-wide stop flag (what the signal handler does; tests call it directly)."""
    if not _stop.is_set():
        _signum[:] = [signum]
        _stop.set()


def reset_stop() -> None:
    _signum.clear()
    _stop.clear()


def exit_code(signum: int) -> int:
    """The shell convention: 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + int(signum)


def _recording(frame: FrameType | None) -> bool:
    """Whether ``frame`` (the main thread's) is inside Optuna's tell (:data:`OPTUNA_TELL_MODULE`.
    :data:`OPTUNA_TELL_FUNCTION`). Optuna 5's ``_run_trial`` cannot take an interrupt there: its ``finally``
    reads ``updated_state``, unbound after a ``KeyboardInterrupt`` (an ``UnboundLocalError``, and the trial
    stays RUNNING), so the signal only raises the stop flag and :func:`raise_if_stopped` raises it."""
    while frame is not None:
        if (
            frame.f_code.co_name == OPTUNA_TELL_FUNCTION
            and frame.f_globals.get("__name__") == OPTUNA_TELL_MODULE
        ):
            return True
        frame = frame.f_back
    return False


def _in_storage(frame: FrameType | None) -> bool:
    """Whether ``frame`` (the main thread's) is inside one of :data:`STORAGE_PACKAGES`."""
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if any(name == p or name.startswith(p + ".") for p in STORAGE_PACKAGES):
            return True
        frame = frame.f_back
    return False


def raise_if_stopped(study: object, trial: object) -> None:
    """An ``optimize`` callback (run after each trial is recorded): raise :class:`Interrupted` when a signal
    arrived and has not been raised yet (it came while the trial was recorded, or ``graceful``)."""
    signum = stop_signal()
    if signum is not None:
        raise Interrupted(signum)


@contextmanager
def handle_signals(*, graceful: bool = False) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM set the stop flag and raise :class:`Interrupted` in the main thread;
    the previous handlers are restored (and the flag cleared) on exit. A no-op outside the main thread. The
    flag keeps the first signal, and every :class:`Interrupted` raised here carries it: SIGTERM then Ctrl-C is
    a SIGTERM stop (exit 143) made immediate.

    While Optuna records a trial the signal is held until it is recorded (pass :func:`raise_if_stopped` as an
    ``optimize`` callback). ``graceful``: a first signal only sets the flag and says so on stderr — a launched
    job is stopped at its runner's next poll, the objective raises before it starts a runner, the callback
    after the trial — so no library code is cut in the middle (a SQLAlchemy weakref callback, a storage
    write); a second signal raises at once, unless it comes during a storage call (:data:`STORAGE_PACKAGES`:
    then it is raised at the next of those checks); a third raises even there (a storage call that hangs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    received = [0]

    def handler(signum: int, frame: FrameType | None) -> None:
        received[0] += 1
        first = stop_signal() is None
        request_stop(signum)
        signum = stop_signal() or signum  # the first signal's (a second one only makes the stop immediate)
        if graceful and first:
            name = signal.Signals(signum).name
            os.write(
                2,
                f"{name}: stopping after the running trial (a launched job is stopped now); "
                f"send it again to stop at once\n".encode(),
            )
            return
        if _recording(frame) or (received[0] <= 2 and _in_storage(frame)):
            return  # raised at the next check: raise_if_stopped, the objective's, a runner's poll
        raise Interrupted(signum)

    reset_stop()
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        reset_stop()
