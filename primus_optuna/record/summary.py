""":class:`StudySummary`: the study's account (:class:`~primus_optuna.record.account.StudyAccount`: trials
by state and reason, launched/failed/stopped jobs, sources of values, GPU-hours spent and not spent) with its
best trial, gain and next commands; the run summary (``run``'s last lines), ``run --json``, the report's
executive summary and the dashboard's study note are all written from it, so a figure reads the same
everywhere.

Rules beside the account's:

- **baseline and centre**: the study's baseline trial (its configuration) and the sweep's centre (the trial
  the sweep started from; the baseline itself unless it is illegal or does not fit); the gain is over the
  baseline when it completed, else over the centre, and says which;
- **LLM** usage from :func:`llm_usage` (the study's stored accounting);
- **peak memory** of a trial: the measured peak when the run measured one, the estimate and the calibrated
  estimate (the one the memory filter compares) beside it;
- **error band** of the estimates (:mod:`~primus_optuna.physics.uncertainty`): the error of the study's own
  measured trials (measured ÷ estimated − 1) once it has :data:`~primus_optuna.physics.uncertainty.MIN_ROWS`,
  else the held-back band of the study's regime; a gain between two estimated values is judged against the
  band of their *ratio* (:func:`~primus_optuna.physics.uncertainty.ratio_band`: the errors of two configurations
  of one study are correlated), and flagged when it lies inside it (the baseline may be as fast).

Example::

    s = study_summary(record_of(study, "sqlite:///x.db"))
    print("\\n".join(s.lines()))
    json.dumps(s.to_dict())
"""

from __future__ import annotations

import shlex
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..physics.memory_calibration import MemoryCalibration
from ..physics.uncertainty import (
    Band,
    estimate_band,
    gain_inside_band,
    gain_verdict,
    ratio_band,
    regime_of,
    residual_band,
    residual_ratio_band,
)
from ..redaction import redact_url
from ..run.base import value_kind
from ..search.attrs import reason_category  # noqa: F401 (re-exported: the one classifier)
from ..space.megatron_args import export_refusal, uses_primus
from ..space.torchtitan_args import uses_torchtitan
from ..spec import StudySpec
from .account import StudyAccount, study_account
from .storage import sibling_dir, storage_file

if TYPE_CHECKING:  # the report package imports this module (its executive summary)
    from .report.record import StudyRecord, TrialRow

PROGRAM = "primus-optuna"


@dataclass(frozen=True)
class LLMUsage:
    """What the LLM planner used (:func:`~primus_optuna.search.llm_budget.llm_accounting`)."""

    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    rejected: int = 0
    failed_calls: int = 0
    unparseable: int = 0
    truncated: int = 0
    """answers that stopped at ``llm.max_tokens``"""
    tool_calls: int = 0
    proposed: int = 0
    accepted: int = 0
    repaired: int = 0
    stop_reason: str | None = None

    def _head(self) -> str:
        return (
            f"{self.calls} calls ({self.failed_calls} with no answer, {self.unparseable} unparseable), "
            f"{self.tokens} tokens, ${self.cost_usd:.4f}"
        )

    def _cut(self) -> str:
        n = self.truncated
        return f", {n} answer{'s' * (n != 1)} cut at llm.max_tokens" if n else ""

    def text(self) -> str:
        """The short form (run summary, executive summary, dashboard)."""
        out = self._head() + (f", {self.rejected} candidates rejected" if self.rejected else "") + self._cut()
        return out + (f"; stopped: {self.stop_reason}" if self.stop_reason else "")

    def detail(self) -> str:
        """The report's planner section: tool calls and the candidates' fate too."""
        out = "LLM usage: " + self._head()
        out += (f", {self.tool_calls} tool calls" if self.tool_calls else "") + self._cut()
        if self.proposed:
            out += (
                f"; {self.proposed} candidates proposed, {self.accepted} accepted ({self.repaired} repaired), "
                f"{self.rejected} rejected"
            )
        return out + "." + (f" Stopped: {self.stop_reason}." if self.stop_reason else "")


def as_number(v: Any) -> float | None:
    """A stored attr as a float, ``None`` when absent or not a number."""
    try:
        return None if v is None or isinstance(v, bool) else float(v)
    except (TypeError, ValueError):
        return None


def llm_usage(books: dict[str, Any]) -> LLMUsage:
    """The LLM accounting of a study (its :attr:`StudyRecord.llm`, read by ``llm_accounting``)."""

    def num(key: str) -> float:
        return as_number(books.get(key)) or 0.0

    return LLMUsage(
        calls=int(num("calls")),
        tokens=int(num("tokens")),
        cost_usd=num("cost_usd"),
        rejected=int(num("rejected")),
        failed_calls=int(num("failed")),
        unparseable=int(num("unparseable")),
        truncated=int(num("truncated")),
        tool_calls=int(num("tool_calls")),
        proposed=int(num("proposed")),
        accepted=int(num("accepted")),
        repaired=int(num("repaired")),
        stop_reason=books.get("stop_reason"),
    )


@dataclass(frozen=True)
class TrialBrief:
    """One trial as the summary names it."""

    trial: int
    state: str
    phase: str
    config_key: str | None
    params: dict[str, Any]
    tokens_per_s_per_gpu: float | None
    source: str | None
    estimate_tokens_per_s_per_gpu: float | None
    measured_peak_memory_gib: float | None
    estimated_peak_memory_gib: float | None
    calibrated_peak_memory_gib: float | None
    outcome: str

    @property
    def measured(self) -> bool:
        return self.source not in (None, "analytical")

    @property
    def value_kind(self) -> str:
        """How the value came about: ``measured``, ``projected`` (a profile), ``estimated`` or ``from your
        objective`` (an objective that records no source)."""
        return value_kind(self.source) or "from your objective"

    def peak_text(self) -> str:
        """``peak memory X GiB measured (estimate Y GiB, calibrated Z GiB)``: measured first."""

        def gib(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        cal = self.calibrated_peak_memory_gib
        cal_text = f"calibrated estimate {gib(cal)} GiB" if cal is not None else ""
        if self.measured_peak_memory_gib is not None:
            beside = ", ".join(
                x for x in (f"estimate {gib(self.estimated_peak_memory_gib)} GiB", cal_text) if x
            )
            return f"peak memory {gib(self.measured_peak_memory_gib)} GiB measured ({beside})"
        est = f"peak memory {gib(self.estimated_peak_memory_gib)} GiB estimated"
        return f"{est} ({cal_text})" if cal_text else est

    def peak_short(self) -> str:
        """``97.2 GiB measured`` or ``100.0 GiB estimated`` (``peak unknown`` without either)."""
        if self.measured_peak_memory_gib is not None:
            return f"{self.measured_peak_memory_gib:.1f} GiB measured"
        if self.estimated_peak_memory_gib is not None:
            return f"{self.estimated_peak_memory_gib:.1f} GiB estimated"
        return "peak unknown"


def _brief(t: TrialRow, mcal: MemoryCalibration) -> TrialBrief:
    est_peak = t.peak_gib
    return TrialBrief(
        trial=t.number,
        state=t.state,
        phase=t.phase,
        config_key=t.attr("config_key") or (t.config.key() if t.config else None),
        params=t.config.to_params() if t.config else {},
        tokens_per_s_per_gpu=t.value,
        source=t.attr("source"),
        estimate_tokens_per_s_per_gpu=t.estimate,
        measured_peak_memory_gib=as_number(t.attr("measured_peak_memory_gib")),
        estimated_peak_memory_gib=est_peak,
        calibrated_peak_memory_gib=as_number(t.attr("memory_peak_calibrated_gib"))
        or (round(est_peak * mcal.scale, 3) if est_peak is not None and not mcal.is_identity else None),
        outcome=t.outcome,
    )


@dataclass(frozen=True)
class GpuHours:
    spent: float
    saved_memory: float
    memory_pruned: int
    saved_early_stop: float
    stopped: int


def suggested_export(spec: StudySpec) -> str:
    """The export format to suggest after a run, one the study's GPUs run: the Primus overlay on AMD GPUs (Primus
    is the Megatron that runs there, :func:`~primus_optuna.space.megatron_args.uses_primus`), upstream Megatron-LM
    arguments elsewhere; the axes as environment variables for a workload that no framework argument expresses
    (:func:`~primus_optuna.space.megatron_args.export_refusal`, which the export itself raises); TorchTitan's
    arguments for a study whose runner launches TorchTitan."""
    if uses_torchtitan(spec):
        return "torchtitan"
    amd = uses_primus(spec)
    if export_refusal(spec, primus=amd) is not None:
        return "env"
    return "primus" if amd else "megatron"


def next_commands(
    storage_url: str, study_name: str, program: str = PROGRAM, export_format: str = "primus"
) -> list[str]:
    """The commands that follow a run, pasteable in a new shell: arguments quoted, a file storage given by
    its absolute path; the export in ``export_format``."""
    url = redact_url(storage_url)
    f = storage_file(url)
    if f is not None and not f.is_absolute():
        url = url.replace(str(f), str(f.resolve()), 1)
    q = shlex.quote
    return [
        f"{program} report --storage {q(url)} --study-name {q(study_name)}",
        f"{program} dashboard --storage {q(url)}",
        f"{program} export --storage {q(url)} --study-name {q(study_name)} --format {export_format}",
    ]


def report_dir(storage_url: str, study_name: str) -> Path:
    """Where ``report`` writes without ``--out``: ``<storage stem>-report`` next to a file storage, else
    ``./<study name>-report``."""
    return sibling_dir(storage_url, study_name.replace("/", "_"), "-report")


@dataclass
class StudySummary:
    """The figures of one study (see the module docstring for each rule)."""

    study: str
    storage: str
    model: str
    n_trials_target: int
    account: StudyAccount
    """the counts and GPU-hours (:mod:`~primus_optuna.record.account`); the properties below read it"""
    best: TrialBrief | None
    baseline: TrialBrief | None
    centre: TrialBrief | None
    centre_key: str | None
    centre_note: str
    start_note: str
    """why the sweep began at the model's best (``search.start``), else empty"""
    baseline_estimate: float | None
    """the baseline's estimated tokens/s/GPU when ``search.start`` began elsewhere and it was not run"""
    gain: float | None
    gain_over: str | None
    """``baseline``, ``centre`` or ``None`` (no completed reference)"""
    estimated_gain: float | None
    llm_model: str | None
    llm: LLMUsage
    pareto: list[TrialBrief] = field(default_factory=list)
    band: Band | None = None
    """the error band of the study's estimates"""
    gain_band: Band | None = None
    """the band of the ratio of two estimates, when the gain is between two estimated values"""
    noise: str = ""
    exhausted: bool = False
    """every legal configuration that fits has been tried (a placeholder trial, or the sampler says so)"""
    next: list[str] = field(default_factory=list)

    # --- the account's figures -----------------------------------------------------------------------------
    @property
    def trials(self) -> int:
        return self.account.trials

    @property
    def by_state(self) -> dict[str, int]:
        return self.account.by_state

    @property
    def placeholders(self) -> int:
        return self.account.placeholders

    @property
    def launched(self) -> int:
        return self.account.launched

    @property
    def launched_failed(self) -> int:
        return self.account.launched_failed

    @property
    def estimated(self) -> int:
        return self.account.estimated

    @property
    def pruned_by_reason(self) -> dict[str, int]:
        return self.account.pruned_by_reason

    @property
    def pruned_before_launch(self) -> dict[str, int]:
        return self.account.pruned_before_launch

    @property
    def stopped_early(self) -> int:
        return self.account.stopped_early

    @property
    def failed_by_reason(self) -> dict[str, int]:
        return self.account.failed_by_reason

    @property
    def trials_by_phase(self) -> dict[str, int]:
        return self.account.by_phase

    @property
    def gpus(self) -> int:
        return self.account.gpus

    @property
    def gpu_hours(self) -> GpuHours:
        a = self.account
        return GpuHours(
            a.gpu_hours_spent,
            a.gpu_hours_saved_memory,
            a.memory_pruned,
            a.gpu_hours_saved_early_stop,
            a.stopped_early,
        )

    # --- text ----------------------------------------------------------------------------------------------
    def trials_text(self) -> str:
        s = self.by_state
        parts = [f"{s.get('complete', 0)} complete", f"{s.get('pruned', 0) - self.placeholders} pruned"]
        parts.append(f"{s.get('fail', 0)} failed")
        if s.get("running"):
            parts.append(f"{s['running']} running")
        if s.get("waiting"):
            parts.append(f"{s['waiting']} queued")
        if self.placeholders:
            parts.append(
                f"{self.placeholders} placeholder{'s' * (self.placeholders != 1)} (nothing left to try)"
            )
        return f"{self.trials} trials — " + ", ".join(parts)

    def launched_text(self) -> str:
        pre = sum(self.pruned_before_launch.values())
        pre_text = ", ".join(f"{k} {v}" for k, v in self.pruned_before_launch.items()) or "none"
        out = f"{self.launched} launched"
        if self.launched:
            out += f" ({self.launched_failed} of them failed, {self.stopped_early} stopped early)"
        out += f", {self.estimated} estimated by the analytical runner (no GPU), {pre} pruned before launch ({pre_text})"
        return out

    @property
    def gain_inside_band(self) -> bool | None:
        """Whether the gain (between two estimates: :attr:`gain_band` is set) lies inside the band of their
        ratio; ``None`` for a measured gain or none."""
        g = self.gain if self.gain is not None else self.estimated_gain
        if self.gain_band is None or g is None:
            return None
        return gain_inside_band(g, self.gain_band)

    def band_note(self) -> str:
        """``; a ±18% error of the ratio of two estimates could undo it: the reference may be as fast``"""
        inside, b = self.gain_inside_band, self.gain_band
        g = self.gain if self.gain is not None else self.estimated_gain
        if inside is None or b is None or g is None:
            return ""
        return f"; {gain_verdict(g, b)}" + (": the reference may be as fast" if inside else "")

    def _gain_over_model_start(self, figures: str) -> str:
        """The gain when the sweep began at the model's best and the baseline was not run."""
        assert self.gain is not None and self.centre is not None
        best_is_centre = self.best is not None and self.best.trial == self.centre.trial
        out = (
            f"gain over the sweep centre, the model's best ({figures}; search.start began there and the "
            f"baseline was not run): "
            + ("the centre is the best" if best_is_centre else f"{self.gain:+.1%}{self.band_note()}")
        )
        best_est = self.best.estimate_tokens_per_s_per_gpu if self.best is not None else None
        if best_est and self.baseline_estimate:
            est = best_est / self.baseline_estimate - 1
            out += f"; the model puts the best {est:+.1%} over the baseline's {self.baseline_estimate:,.0f} estimated"
        return out

    def gain_text(self) -> str:
        ref = self.baseline if self.gain_over == "baseline" else self.centre
        if self.gain is not None and ref is not None:
            kind = ref.value_kind
            figures = f"trial {ref.trial}, {ref.tokens_per_s_per_gpu:.1f} tokens/s/GPU {kind}"
            if self.gain_over == "baseline":
                return f"gain over the baseline ({figures}): {self.gain:+.1%}{self.band_note()}"
            if self.start_note:
                return self._gain_over_model_start(figures)
            note = self.centre_note.removeprefix("the study's baseline ")
            why = f": it {note}" if note != self.centre_note else f": {note}" if note else ""
            return (
                f"gain over the sweep centre ({figures}; the study's baseline was not run{why}): {self.gain:+.1%}"
                + self.band_note()
            )
        if self.baseline is None:
            return "gain over the baseline: n/a (the baseline has not been tried)"
        est = (
            f"; estimated gain {self.estimated_gain:+.1%}{self.band_note()}"
            if self.estimated_gain is not None
            else ""
        )
        return f"gain over the baseline: n/a (the baseline, trial {self.baseline.trial}, {self.baseline.outcome}){est}"

    def band_text(self) -> str:
        """``error band of the estimates: −76%/+13% (catalog constants, ...)``"""
        if self.band is None:
            return ""
        return f"error band of the estimates: {self.band.text()} ({self.band.source})"

    def gpu_hours_text(self) -> str:
        g = self.gpu_hours
        mem = (
            f"{g.saved_memory:.2f} thanks to the memory filter ({g.memory_pruned} trial"
            f"{'s' * (g.memory_pruned != 1)} pruned before launch, estimated)"
        )
        if not self.launched:
            return "GPU-hours: none spent (no job launched)" + (
                f"; the memory filter pruned {g.memory_pruned} trials that would have cost "
                f"{g.saved_memory:.2f} (estimated)"
                if g.memory_pruned
                else ""
            )
        return (
            f"GPU-hours: {g.spent:.2f} spent on {self.launched} launched job{'s' * (self.launched != 1)}; "
            f"not spent: {mem}, {g.saved_early_stop:.2f} thanks to early stopping ({g.stopped} "
            f"job{'s' * (g.stopped != 1)} stopped early)"
        )

    def llm_text(self) -> str:
        return f"LLM planner {self.llm_model}: {self.llm.text()}"

    def lines(self) -> list[str]:
        """The run summary (``run``'s last lines)."""
        out = [f"study {self.study!r}: {self.trials_text()}"]
        b = self.best
        if b is not None:
            out += [
                f"best configuration (trial {b.trial}, {b.phase}):",
                f"  {b.config_key}",
                f"  {b.tokens_per_s_per_gpu:.1f} tokens/s/GPU ({b.value_kind}), {b.peak_text()}",
            ]
            if self.band is not None:
                out.append("  " + self.band_text())
            if self.noise:
                out.append(f"  warning: {self.noise}")
            out.append("  " + self.gain_text())
            if self.pareto:
                out.append(f"Pareto front ({len(self.pareto)} trials, tokens/s/GPU vs peak GiB):")
                out += [
                    f"  #{t.trial}: {t.tokens_per_s_per_gpu:.1f} tok/s/GPU "
                    f"({t.value_kind}), {t.peak_short()}  {t.config_key}"
                    for t in self.pareto
                ]
        else:
            out.append("no trial has completed yet")
        centre_words = "; ".join(x for x in (self.centre_note, self.start_note) if x)
        if self.centre_key and self.gain_over != "centre" and centre_words:
            out.append(f"sweep centre: {self.centre_key} ({centre_words})")
        if self.pruned_by_reason:
            out.append("pruned by reason: " + ", ".join(f"{k} {v}" for k, v in self.pruned_by_reason.items()))
        if self.exhausted:
            out.append("the search is complete: every legal configuration that fits in memory has been tried")
        if self.failed_by_reason:
            out.append("failed by reason: " + ", ".join(f"{k} {v}" for k, v in self.failed_by_reason.items()))
        out.append("budget: " + self.launched_text())
        out.append(self.gpu_hours_text())
        if self.trials_by_phase:
            out.append(
                "trials by phase: " + ", ".join(f"{k} {v}" for k, v in sorted(self.trials_by_phase.items()))
            )
        if self.llm.calls or self.llm.failed_calls:
            out.append(self.llm_text())
        out.append("next:")
        out += [f"  {c}" for c in self.next]
        return out

    def to_dict(self) -> dict[str, Any]:
        """``run --json``: every figure of :meth:`lines`, machine-readable."""
        d = asdict(self)
        d["account"] = self.account.to_dict()
        for key in (
            "trials",
            "by_state",
            "placeholders",
            "launched",
            "launched_failed",
            "estimated",
            "pruned_by_reason",
            "pruned_before_launch",
            "stopped_early",
            "failed_by_reason",
            "trials_by_phase",
            "gpus",
        ):
            d[key] = getattr(self, key)
        d["gpu_hours"] = asdict(self.gpu_hours)
        d["gain_over_baseline"] = self.gain if self.gain_over == "baseline" else None
        d["band"] = self.band.to_dict() if self.band else None
        d["gain_band"] = self.gain_band.to_dict() if self.gain_band else None
        d["gain_inside_band"] = self.gain_inside_band
        d["budget"] = {
            "n_trials": self.n_trials_target,
            "trials": self.trials,
            "launched": self.launched,
            "launched_failed": self.launched_failed,
            "stopped_early": self.stopped_early,
            "estimated": self.estimated,
            "pruned_before_launch": self.pruned_before_launch,
            "running": self.by_state.get("running", 0),
            "placeholders": self.placeholders,
        }
        d["gpu_hours"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in d["gpu_hours"].items()}
        return d


def _noise(done: list[TrialRow]) -> str:
    """The two fastest configurations closer than the measurement noise (median spread of repeated runs)."""
    spreads = [v for t in done if (v := as_number(t.attr("measured_spread")))]
    if not spreads or len(done) < 2:
        return ""
    noise = statistics.median(spreads)
    a, b = sorted(done, key=lambda t: -(t.value or 0.0))[:2]
    if (a.value or 0.0) - (b.value or 0.0) > noise * (a.value or 0.0) or not b.value:
        return ""
    return (
        f"trials {a.number} and {b.number} are within the measurement noise ({(a.value or 0.0) / b.value - 1.0:+.1%} "
        f"apart; repeated runs spread {noise:.1%}): measure both again before choosing"
    )


def _measured_errors(rec: StudyRecord) -> list[float]:
    """measured ÷ estimated − 1 of the study's completed measured trials."""
    return [
        t.measured / t.estimate - 1.0
        for t in rec.complete
        if value_kind(t.attr("source")) == "measured" and t.estimate and t.measured
    ]


def estimates_band(rec: StudyRecord) -> Band:
    """The error band of the study's estimates: its own measured trials' errors once there are enough, else
    the held-back band of its regime."""
    return residual_band(_measured_errors(rec), regime_of(rec.spec)) or estimate_band(rec.spec)


def estimates_ratio_band(rec: StudyRecord) -> Band:
    """The error band of the ratio of two of the study's estimates: from its own measured trials' errors once
    there are enough, else the held-back ratio band of its regime."""
    return residual_ratio_band(_measured_errors(rec), regime_of(rec.spec)) or ratio_band(rec.spec)


def _gain_band(rec: StudyRecord, best: TrialRow | None, ref: TrialRow | None) -> Band | None:
    """The ratio band of a gain between two estimates: ``best`` over the completed reference ``ref`` when both
    values are estimated, or the estimated gain when there is no completed reference (``ref`` is ``None``);
    ``None`` for a measured gain."""
    if best is None:
        return None
    kinds = {value_kind(t.attr("source")) for t in (best, ref) if t is not None}
    if ref is not None and kinds != {"estimated"}:
        return None
    return estimates_ratio_band(rec)


def study_summary(rec: StudyRecord, program: str = PROGRAM, exhausted: bool = False) -> StudySummary:
    """The :class:`StudySummary` of a study read back from storage (or live); ``exhausted``: the sampler has
    nothing left to propose (``PrimusSampler.is_exhausted``, known to a live study only)."""
    rows = rec.trials
    acc = study_account(rec)
    mcal = MemoryCalibration.from_dict(rec.user_attrs.get("memory_calibration"))
    best_row, base_row = rec.best, rec.baseline
    centre_row = next(
        (t for t in rows if t.attr("sweep_axis") == "baseline" and t.state == "COMPLETE"), None
    ) or next((t for t in rows if t.attr("sweep_axis") == "baseline"), None)
    design = rec.user_attrs.get("sweep") if isinstance(rec.user_attrs.get("sweep"), dict) else {}
    centre_key = design.get("centre") or (centre_row.attr("config_key") if centre_row else None)
    centre_note = str(design.get("centre_note") or "")
    start = design.get("start") if isinstance(design.get("start"), dict) else {}
    gain = gain_over = None
    if best_row is not None:
        for name, ref in (("baseline", base_row), ("centre", centre_row)):
            if ref is not None and ref.state == "COMPLETE" and ref.value:
                gain, gain_over = best_row.value / ref.value - 1.0, name
                break
    est_gain = None
    if best_row is not None and base_row is not None and best_row.estimate and base_row.estimate:
        est_gain = best_row.estimate / base_row.estimate - 1.0
    return StudySummary(
        study=rec.study_name,
        storage=redact_url(rec.storage_url),
        model=rec.spec.model.name,
        n_trials_target=rec.spec.search.n_trials,
        account=acc,
        best=_brief(best_row, mcal) if best_row else None,
        baseline=_brief(base_row, mcal) if base_row else None,
        centre=_brief(centre_row, mcal) if centre_row else None,
        centre_key=centre_key,
        centre_note=centre_note,
        start_note=str(start.get("note") or ""),
        baseline_estimate=start.get("baseline_estimate") if base_row is None else None,
        gain=gain,
        gain_over=gain_over,
        estimated_gain=est_gain,
        llm_model=rec.llm_model,
        llm=llm_usage(rec.llm),
        pareto=[_brief(t, mcal) for t in rec.pareto()],
        band=estimates_band(rec) if best_row is not None else None,
        gain_band=_gain_band(
            rec, best_row, {"baseline": base_row, "centre": centre_row}.get(gain_over or "")
        ),
        noise=_noise(rec.complete),
        exhausted=exhausted or acc.placeholders > 0,
        next=next_commands(rec.storage_url, rec.study_name, program, suggested_export(rec.spec))
        if rec.storage_url
        else [],
    )
