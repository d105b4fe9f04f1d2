"""The signal handling of ``primus-optuna run`` (run/interrupt.py), with real signals sent to this process."""

import importlib
import os
import signal
import sys
import threading

import optuna
import pytest

from primus_optuna.run.interrupt import (
    OPTUNA_TELL_FUNCTION,
    OPTUNA_TELL_MODULE,
    Interrupted,
    _recording,
    exit_code,
    handle_signals,
    raise_if_stopped,
    request_stop,
    reset_stop,
    stop_signal,
)

State = optuna.trial.TrialState


@pytest.fixture(autouse=True)
def _no_stop_left():
    reset_stop()
    yield
    reset_stop()


def _kill_self(sig: int) -> None:
    os.kill(os.getpid(), sig)  # CPython runs the handler in this (main) thread before the next line


def test_optunas_tell_is_where_the_handler_looks_for_it():
    # an Optuna release that moves or renames its tell must fail here, not silently let a signal cut into it
    module = importlib.import_module(OPTUNA_TELL_MODULE)
    tell = getattr(module, OPTUNA_TELL_FUNCTION)
    assert callable(tell) and tell.__module__ == OPTUNA_TELL_MODULE
    assert tell.__code__.co_name == OPTUNA_TELL_FUNCTION  # what the handler compares with a frame's code
    from optuna.study import _optimize

    assert OPTUNA_TELL_FUNCTION in _optimize._run_trial.__code__.co_names  # optimize records trials with it


class _FrameSampler(optuna.samplers.RandomSampler):
    """Answers, in ``after_trial`` (called by Optuna's tell), whether :func:`_recording` sees the tell."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.seen: list[bool] = []

    def after_trial(self, study, trial, state, values) -> None:
        self.seen.append(_recording(sys._getframe()))


def test_recording_is_true_inside_optunas_tell_only():
    sampler = _FrameSampler()
    study = optuna.create_study(sampler=sampler)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert sampler.seen == [True, True]
    assert not _recording(sys._getframe())
    assert not _recording(None)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_raises_interrupted_and_the_flag_names_it(sig):
    before = signal.getsignal(sig)
    with pytest.raises(Interrupted) as exc, handle_signals():
        _kill_self(sig)
        pytest.fail("the signal did not raise")  # pragma: no cover
    assert exc.value.signum == sig and isinstance(exc.value, KeyboardInterrupt)
    assert stop_signal() is None  # cleared on exit
    assert signal.getsignal(sig) is before  # the previous handler is back


def test_graceful_first_signal_only_raises_the_flag_and_a_second_carries_the_first(capfd):
    with handle_signals(graceful=True):
        _kill_self(signal.SIGTERM)
        assert stop_signal() == signal.SIGTERM  # no exception: the running trial ends first
        assert "SIGTERM: stopping after the running trial" in capfd.readouterr().err
        with pytest.raises(Interrupted) as exc:
            _kill_self(signal.SIGINT)  # "send it again to stop at once"
        assert exc.value.signum == signal.SIGTERM  # the stop is still SIGTERM's: exit 143
        assert stop_signal() == signal.SIGTERM
    assert stop_signal() is None


class _SignallingSampler(optuna.samplers.RandomSampler):
    """Sends a signal to this process while Optuna records trial ``at`` (in ``after_trial``)."""

    def __init__(self, sig: int, at: int) -> None:
        super().__init__(seed=0)
        self.sig, self.at = sig, at

    def after_trial(self, study, trial, state, values) -> None:
        if trial.number == self.at:
            _kill_self(self.sig)


def test_a_signal_during_tell_waits_until_the_trial_is_recorded():
    # raised inside tell, optuna's _run_trial would turn it into an UnboundLocalError and leave the trial RUNNING
    study = optuna.create_study(sampler=_SignallingSampler(signal.SIGTERM, at=1))
    with pytest.raises(Interrupted) as exc, handle_signals():
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=10, callbacks=[raise_if_stopped])
    assert exc.value.signum == signal.SIGTERM
    assert [t.state for t in study.trials] == [State.COMPLETE, State.COMPLETE]


def test_raise_if_stopped_raises_the_flags_signal_only_when_raised():
    raise_if_stopped(None, None)  # no flag: nothing
    request_stop(signal.SIGTERM)
    request_stop(signal.SIGINT)  # the first signal stays
    with pytest.raises(Interrupted) as exc:
        raise_if_stopped(None, None)
    assert exc.value.signum == signal.SIGTERM


def test_exit_code_is_128_plus_the_signal():
    assert exit_code(signal.SIGINT) == 130 and exit_code(signal.SIGTERM) == 143


def test_handle_signals_is_a_no_op_outside_the_main_thread():
    handlers: list[object] = []

    def body() -> None:
        with handle_signals():
            handlers.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert handlers == [before]


def test_a_second_signal_during_a_storage_write_is_held_a_third_is_not(tmp_path):
    # cut into, a write left its SQLite transaction open ("database is locked" next) or a trial RUNNING
    from sqlalchemy import event

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'h.db'}")
    study = optuna.create_study(storage=storage)
    pending: list[int] = []

    def signal_in_commit(conn) -> None:  # called by SQLAlchemy, inside Optuna's storage call
        if pending:
            _kill_self(pending.pop())

    event.listen(storage.engine, "commit", signal_in_commit)
    with handle_signals(graceful=True):
        _kill_self(signal.SIGTERM)  # the first: the flag only
        pending.append(signal.SIGINT)
        study.set_user_attr("written", 1)  # the second signal comes during this write
        assert not pending and study.user_attrs == {"written": 1}
        pending.append(signal.SIGINT)
        with pytest.raises(Interrupted) as exc:
            study.set_user_attr("third", 1)
        assert exc.value.signum == signal.SIGTERM  # (a storage call that hangs can still be stopped)
