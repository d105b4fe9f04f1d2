"""The ``command`` runner: launch a real job from an argv template and parse its log.

The argv and the environment are *templates* rendered per trial from a fixed set of names whose values come
only from the validated, canonical configuration and the study (:func:`template_values`): the nine axes, ``dp``,
``num_microbatches``, ``world``, ``nodes``, ``gpus_per_node``, ``hosts``, ``gpus_per_host``, ``seq_length``,
``global_batch_size``, ``precision``, ``trial``, ``workdir``, ``log`` and ``python`` (plus what a preset adds, e.g. ``overlay``).
Each template element renders to exactly one argv element; nothing is ever passed through a shell, and a
field name outside that set, attribute access (``{tp.x}``) or indexing is refused when the runner is built.
A configuration whose values are not the legal enumerated ones is refused before anything starts.

Outcome: an out-of-memory message anywhere in the log → :class:`OutOfMemory`; the timeout → the whole process
group is killed, :class:`RunTimeout`; a non-zero exit → :class:`LaunchFailure`, unless the log reached its last
iteration (``iteration N/ N``) with a throughput (a crash at teardown, common with NCCL/gloo, keeps the
measurement and records ``exit_code``); a clean exit without a throughput → :class:`NoThroughput`.

While the job runs, when the objective set ``context.on_iteration``, the log is read every ``poll_s`` seconds
(:class:`~primus_optuna.run.follow.LogFollower`) and each new steady-state iteration is passed to it; when it
answers with a reason the process group is ended and :class:`EarlyStopped` carries the reason and the GPU-hours
the remaining iterations would have taken.

Example::

    runner = CommandRunner(spec, ["bash", "train.sh", "--tp", "{tp}", "--mbs", "{mbs}"], timeout_s=3600)
    runner.run(config, RunContext(spec, workdir=Path("trial-0")))
"""

from __future__ import annotations

import os
import re
import signal
import string
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..space import Space, TrainingConfig
from ..spec import AXES, INT_AXES, StudySpec
from .base import (
    EarlyStopped,
    LaunchFailure,
    Measurement,
    NoThroughput,
    OutOfMemory,
    RunContext,
    RunTimeout,
)
from .follow import LiveIteration, LogFollower
from .interrupt import Interrupted, stop_signal
from .logparse import parse_log, robust_mean, tail

CONFIG_FIELDS: tuple[str, ...] = (
    *AXES,
    "dp",
    "num_microbatches",
    "world",
    "nodes",
    "gpus_per_node",
    "hosts",
    "gpus_per_host",
    "seq_length",
    "global_batch_size",
    "precision",
    "trial",
)
PATH_FIELDS: tuple[str, ...] = ("workdir", "log", "python")
TEMPLATE_FIELDS: tuple[str, ...] = CONFIG_FIELDS + PATH_FIELDS
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.+:-]*$")  # ":" and "+": recompute values (full:2, selective:a+b)
KILL_GRACE_S = 5.0
STOP_GRACE_S = 30.0
"""how long an interrupted job's process group may take to exit after the forwarded signal before SIGKILL
(torchrun forwards SIGTERM to its workers, which may flush a checkpoint or NCCL teardown)"""
POLL_S = 0.2
"""how often a running job is checked for a stop signal and its log read for new iterations (when the
objective follows it)"""
LOG_NAME = "run.log"


def template_fields(template: str) -> list[str]:
    """The field names a template uses; raises :class:`SpecError` on anything but plain ``{name}`` fields."""
    names = []
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise SpecError(
            f"runner template {template!r}: {exc} (write literal braces as '{{{{' and '}}}}')"
        ) from None
    for _, name, spec, conv in parts:
        if name is None:
            continue
        if not name.isidentifier() or spec or conv:
            raise SpecError(
                f"runner template {template!r}: only plain fields like {{tp}} are allowed, got {{{name}"
                f"{'!' + conv if conv else ''}{':' + spec if spec else ''}}}"
            )
        names.append(name)
    return names


def check_templates(templates: Sequence[str], allowed: Sequence[str], where: str) -> None:
    """Refuse templates that use a field outside ``allowed``."""
    for t in templates:
        for name in template_fields(t):
            if name not in allowed:
                raise SpecError(
                    f"runner.options.{where}: unknown field {{{name}}} in {t!r}; fields are {', '.join(allowed)}"
                )


def render(template: str, values: Mapping[str, str]) -> str:
    """Render one template element (fields already checked) to one string."""
    out = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is not None:
            out.append(values[name])
    return "".join(out)


def canonical_config(spec: StudySpec, config: TrainingConfig, space: Space | None = None) -> TrainingConfig:
    """Re-validate every axis value (type and enumerated choices) and return the canonical, derived form.

    Raises :class:`LaunchFailure` for a value that is not a legal axis value, an illegal configuration or
    one whose dp/micro-batches are not whole — nothing is launched for those.
    """
    space = space or Space(spec)
    try:
        clean = TrainingConfig.from_params({a: getattr(config, a) for a in AXES})
    except SpecError as exc:
        raise LaunchFailure(f"refused to launch: {exc}") from None
    for a in INT_AXES:
        if type(getattr(config, a)) is not int:
            raise LaunchFailure(f"refused to launch: {a} must be an int, got {getattr(config, a)!r}")
    canon = space.canonical(clean)
    reasons = space.check(canon)
    if reasons:
        raise LaunchFailure("refused to launch an illegal configuration: " + "; ".join(reasons))
    return canon


def template_values(
    spec: StudySpec, config: TrainingConfig, context: RunContext, log_path: Path
) -> dict[str, str]:
    """The values templates may use; every config-derived value matches ``[A-Za-z0-9_.+-]*``."""
    values: dict[str, Any] = {
        **config.to_dict(),
        **{a: getattr(config, a) for a in AXES},  # every axis, an optional one at its default too
        "world": spec.world,
        "nodes": spec.cluster.nodes,
        "gpus_per_node": spec.cluster.gpus_per_node,
        "hosts": spec.cluster.hosts,
        "gpus_per_host": spec.cluster.host_gpus,
        "seq_length": spec.workload.seq_length,
        "global_batch_size": spec.workload.global_batch_size,
        "precision": spec.workload.precision,
        "trial": "" if context.trial_number is None else context.trial_number,
    }
    out = {k: str(v) for k, v in values.items()}
    for k, v in out.items():
        if not _SAFE_VALUE.match(v):  # unreachable for a validated config; a last line of defence
            raise LaunchFailure(f"refused to launch: value of {k} ({v!r}) is not a plain token")
    out["workdir"] = str(context.workdir.resolve())
    out["log"] = str(log_path.resolve())
    out["python"] = sys.executable
    return out


Prepare = Callable[[TrainingConfig, RunContext, dict[str, str]], dict[str, str]]
"""A preset hook run before launch: writes its files (overlay, batch script) and returns extra template values."""


@dataclass
class Launch:
    """What is about to run (after presets and wrapping)."""

    argv: list[str]
    env: dict[str, str]
    extra_logs: list[Path] = field(default_factory=list)
    """files the job writes its output to (e.g. ``sbatch --output``), appended to the log after it ends"""
    follow_log: Path | None = None
    """the file read for new iterations while the job runs (default: the runner's own log)"""
    cancel: list[str] | None = None
    """a command that ends the job where stopping the local process does not (``scancel``), run whenever
    the job is stopped before it ends: interrupt, timeout, early stop"""


Wrap = Callable[[Launch, dict[str, str], RunContext], Launch]


_WATCHDOG = """
import os, signal, sys, time
if sys.stdin.buffer.read():  # a word from the runner: the job ended normally
    sys.exit(0)
for sig in (signal.SIGTERM, signal.SIGKILL):  # EOF without one: the runner died (kill -9)
    try:
        os.killpg(int(sys.argv[1]), sig)
    except ProcessLookupError:
        sys.exit(0)
    time.sleep(float(sys.argv[2]))
"""


def orphan_guard(pgid: int, grace_s: float = 30.0) -> Callable[[], None]:
    """A watchdog for a launched job's process group: when this process dies without releasing it (even by
    ``kill -9``, which no handler sees) the watchdog sends the group SIGTERM, then SIGKILL after ``grace_s``,
    so no job keeps its GPUs busy unattended. Returns the release function (call it once the job ended)."""
    r, w = os.pipe()  # both ends close-on-exec: only the watchdog holds the read end
    dog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(pgid), str(grace_s)],
        stdin=r,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a terminal's Ctrl-C is handled by the runner, not by the watchdog
    )
    os.close(r)

    def release() -> None:
        try:
            os.write(w, b"done")
        finally:
            os.close(w)
        try:
            dog.wait(timeout=5)
        except subprocess.TimeoutExpired:
            dog.kill()

    return release


class CommandRunner:
    """Run a command per trial; the measurement is parsed from its log."""

    kind = "command"
    repeats = 1
    """measurements per configuration (``runner.options.repeats``); the objective takes the median"""
    launches_jobs = True
    """its trials cost GPU time: the objective follows their logs and records GPU-hours"""

    def __init__(
        self,
        spec: StudySpec,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 3600.0,
        warmup_iters: int = 2,
        cwd: str | Path | None = None,
        kind: str = "command",
        prepare: Prepare | None = None,
        extra_fields: Sequence[str] = (),
        wrap: Sequence[Wrap] = (),
        inherit_env: bool = True,
        preflight: Callable[[], None] | None = None,
    ) -> None:
        if not argv:
            raise SpecError("runner.options.argv: give the command to run as a list, e.g. [bash, train.sh]")
        allowed = (*TEMPLATE_FIELDS, *extra_fields)
        check_templates(list(argv), allowed, "argv")
        env = dict(env or {})
        check_templates(list(env.values()), allowed, "env")
        for k in env:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                raise SpecError(f"runner.options.env: {k!r} is not an environment variable name")
        if timeout_s <= 0:
            raise SpecError("runner.options.timeout_s must be positive")
        self.spec = spec
        self.space = Space(spec)
        self.argv = list(argv)
        self.env = env
        self.timeout_s = float(timeout_s)
        self.warmup_iters = warmup_iters
        self.cwd = Path(cwd) if cwd else None
        self.kind = kind
        self.prepare = prepare
        self.wrap = list(wrap)
        self.inherit_env = inherit_env
        self.poll_s = POLL_S
        self._preflight = preflight

    def preflight(self) -> None:
        """Check, before the first trial, what the launch needs on this host (a preset's checkout, its launcher
        on ``PATH``); raises :class:`SpecError` naming the option. Nothing to check for a plain command."""
        if self._preflight is not None:
            self._preflight()

    def build(self, config: TrainingConfig, context: RunContext) -> tuple[Launch, Path]:
        """Validate the configuration, run the preset hook, render argv/env (no process is started)."""
        canon = canonical_config(self.spec, config, self.space)
        context.workdir.mkdir(parents=True, exist_ok=True)
        log_path = context.workdir / LOG_NAME
        values = template_values(self.spec, canon, context, log_path)
        if self.prepare is not None:
            values.update(self.prepare(canon, context, values))
        launch = Launch(
            argv=[render(t, values) for t in self.argv],
            env={k: render(v, values) for k, v in self.env.items()},
        )
        for w in self.wrap:
            launch = w(launch, values, context)
        return launch, log_path

    def run(self, config: TrainingConfig, context: RunContext) -> Measurement:
        launch, log_path = self.build(config, context)
        env = {**os.environ, **launch.env} if self.inherit_env else dict(launch.env)
        env["PRIMUS_OPTUNA_TRIAL"] = "" if context.trial_number is None else str(context.trial_number)
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            proc = start_in_session(launch.argv, log, log_path, env, self.cwd)
            release = orphan_guard(proc.pid)
            try:
                rc, timed_out, stopped = self._watch(proc, launch.follow_log or log_path, context, t0)
            except KeyboardInterrupt as exc:  # Ctrl-C / SIGTERM: the job must not outlive us (busy GPUs)
                signum = getattr(exc, "signum", signal.SIGINT)
                if not isinstance(exc, Interrupted):
                    _stop_group(proc, signum)
                _cancel(launch)
                raise Interrupted(signum, log_path=str(log_path)) from None
            except BaseException:  # the callback failed (e.g. the storage): never leave the job running
                _kill_group(proc)
                _cancel(launch)
                raise
            finally:
                release()
            if timed_out or stopped is not None:
                _cancel(launch)
        wall = time.monotonic() - t0
        text = log_path.read_text(errors="replace")
        for extra in launch.extra_logs:
            if extra.is_file():
                text += "\n" + extra.read_text(errors="replace")
        log_tail = tail(text)
        where: dict[str, Any] = {"log_path": str(log_path), "log_tail": log_tail, "wall_s": round(wall, 3)}
        parsed = parse_log(text, **self._log_shape())
        if parsed.oom:
            raise OutOfMemory(f"out of memory: {parsed.oom_line}", **where)
        if stopped is not None:
            reason, seen = stopped
            raise EarlyStopped(
                reason,
                **where,
                gpu_hours_saved=self._hours_left(seen),
                iterations=seen[-1].iteration,
                tokens_per_s_per_gpu=robust_mean([it.tokens_per_s_per_gpu for it in seen]),
            )
        if timed_out:
            raise RunTimeout(f"killed after the {self.timeout_s:g} s timeout (process group)", **where)
        if rc != 0 and not (parsed.completed and parsed.tokens_per_s_per_gpu):
            raise LaunchFailure(f"{launch.argv[0]} exited with code {rc}", **where)
        if not parsed.tokens_per_s_per_gpu or not parsed.step_time_s:
            raise NoThroughput(
                f"the log has no throughput ({len(parsed.records)} iteration lines); is log_interval set?",
                **where,
            )
        return Measurement(
            tokens_per_s_per_gpu=parsed.tokens_per_s_per_gpu,
            step_time_s=parsed.step_time_s,
            source="measured",
            peak_memory_gib=parsed.peak_memory_gib,
            peak_reserved_gib=parsed.peak_reserved_gib,
            log_path=str(log_path),
            details={
                **parsed.to_dict(),
                "argv": launch.argv,
                "exit_code": rc,  # non-zero only when it failed at teardown after its last iteration
                "wall_s": round(wall, 3),
                "runner": self.kind,
            },
        )

    def _log_shape(self) -> dict[str, int]:
        """What :func:`parse_log` and :class:`LogFollower` need to read a job's log: tokens per iteration
        and the iterations to skip."""
        w = self.spec.workload
        return {
            "seq_length": w.seq_length,
            "world_size": self.spec.world,
            "global_batch_size": w.global_batch_size,
            "warmup_iters": self.warmup_iters,
        }

    def _watch(
        self, proc: subprocess.Popen[bytes], log_path: Path, context: RunContext, t0: float
    ) -> tuple[int, bool, tuple[str, list[LiveIteration]] | None]:
        """Wait for the job, feeding new log iterations to ``context.on_iteration``; kill its process group
        on the timeout or when the callback asks to stop. Returns (exit code, timed out, (reason, iterations
        seen) when stopped)."""
        follower = None
        if context.on_iteration is not None:
            follower = LogFollower(log_path, **self._log_shape())
        seen: list[LiveIteration] = []
        deadline = t0 + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                rc = proc.wait(timeout=max(0.0, min(self.poll_s, left)))
                break
            except subprocess.TimeoutExpired:
                signum = stop_signal()  # a signal received while another thread runs the main loop
                if signum is not None:
                    _stop_group(proc, signum)
                    raise Interrupted(signum) from None
            except Interrupted as exc:  # the signal handler raised in this (main) thread
                _stop_group(proc, exc.signum)
                raise
            if follower is not None:
                for it in follower.poll():
                    seen.append(it)
                    verdict = context.on_iteration(it, True)  # type: ignore[misc]
                    if verdict:
                        return _kill_group(proc), False, (verdict, seen)
            if time.monotonic() >= deadline:
                return _kill_group(proc), True, None
        if follower is not None:  # what the job logged between the last poll and its exit
            for it in follower.poll():
                context.on_iteration(it, False)  # type: ignore[misc]
        return rc, False, None

    def _hours_left(self, seen: list[LiveIteration]) -> float | None:
        """GPU-hours the stopped job's remaining iterations would have taken (median step time so far)."""
        last = seen[-1]
        steps = [it.step_time_s for it in seen if it.step_time_s]
        if last.target is None or not steps:
            return None
        return max(0, last.target - last.iteration) * robust_mean(steps) * self.spec.world / 3600.0


CANCEL_TIMEOUT_S = 60.0


def _cancel(launch: Launch) -> None:
    """Run the launch's cancel command (e.g. ``scancel --name=...``); a failure is only reported on stderr."""
    if not launch.cancel:
        return
    try:
        subprocess.run(launch.cancel, stdin=subprocess.DEVNULL, capture_output=True, timeout=CANCEL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"primus-optuna: {launch.cancel[0]} failed: {exc}", file=sys.stderr)


def _stop_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    """Forward ``signum`` to the job's process group and wait for the whole group to end (``STOP_GRACE_S``,
    then SIGKILL; a second interrupt while waiting kills at once)."""
    _signal_group(proc.pid, signum)
    deadline = time.monotonic() + STOP_GRACE_S
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(proc.pid):
                return
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _kill_group(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM the whole process group, SIGKILL what is left after a grace period; returns the exit code."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        rc = proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        rc = None
    _signal_group(proc.pid, signal.SIGKILL)  # children that ignored SIGTERM or outlived the leader
    return proc.wait() if rc is None else rc


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_in_session(
    argv: list[str], log: Any, log_path: Path, env: dict[str, str], cwd: str | None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session (process group) of its own, its output to ``log``; a command that cannot
    start is a :class:`LaunchFailure` (its message written to the log)."""
    try:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        msg = f"could not start {argv[0]!r}: {exc}"
        log.write(msg.encode())
        raise LaunchFailure(msg, log_path=str(log_path), log_tail=msg) from None


def run_launch(launch: Launch, log_path: Path, timeout_s: float, cwd: str | None = None) -> int:
    """Run ``launch`` in a session of its own, its output to ``log_path``, and return its exit code: a Ctrl-C
    or SIGTERM stops its whole process group (and runs its cancel command) before the interrupt goes on; past
    ``timeout_s`` the group is killed (:class:`RunTimeout`)."""
    with open(log_path, "wb") as log:
        proc = start_in_session(launch.argv, log, log_path, {**os.environ, **launch.env}, cwd)
        release = orphan_guard(proc.pid)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            _cancel(launch)
            raise RunTimeout(
                f"killed after {timeout_s:g} s (process group)", log_path=str(log_path)
            ) from None
        except BaseException as exc:  # Ctrl-C / SIGTERM: the launched processes must not outlive us
            _stop_group(proc, getattr(exc, "signum", signal.SIGINT))
            _cancel(launch)
            raise
        finally:
            release()
    return rc
