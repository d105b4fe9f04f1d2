""":class:`TrainingConfig`: one point of the search space (frozen, hashable).

The ten axes are the product's interface (Optuna parameter names, YAML keys, CLI flags). ``dp`` and
``num_microbatches`` are derived from the cluster size and global batch and are not part of equality.

Example::

    c = TrainingConfig(tp=1, pp=4, ep=8, vpp=2, mbs=2, pp_schedule="interleaved").derive(world=64, gbs=512)
    c.dp, c.num_microbatches  # (16, 16)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import SpecError
from ..spec.study import AXES, CHOICES, INT_AXES, check_choice

Recompute = str
"""none, selective, selective:<modules>, full, full:N (:mod:`primus_optuna.spec.recompute`)"""
Dispatcher = Literal["alltoall", "deepep"]
Schedule = Literal["1f1b", "interleaved", "zb1p", "zbv"]


_DISPATCHERS = frozenset(CHOICES["moe_dispatcher"])
_SCHEDULES = frozenset(CHOICES["pp_schedule"])
_CANONICAL_SEEN: set[str] = set()
"""recompute strings already checked to be canonical (validation stays O(1) in bulk enumeration)"""


@dataclass(frozen=True, slots=True)
class TrainingConfig:
    """Parallel layout and training options of one trial."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    vpp: int = 1
    mbs: int = 1
    recompute: Recompute = "none"
    moe_dispatcher: Dispatcher = "alltoall"
    pp_schedule: Schedule = "1f1b"
    ep_overlap: bool = False
    """Megatron's ``--overlap-moe-expert-parallel-comm`` (with ``--delay-wgrad-compute``): MoE only"""
    dp: int = field(default=0, compare=False, repr=False)
    """data-parallel size = world / (tp·cp·pp); 0 when not derived or not whole"""
    num_microbatches: int = field(default=0, compare=False, repr=False)
    """m = GBS / (mbs·dp); 0 when not derived or not whole"""

    def __post_init__(self) -> None:
        # categorical axes: a SpecError (ValueError) naming the field and the allowed values; recompute is
        # stored in canonical form (module order, ``selective:core_attn`` → ``selective``)
        if self.moe_dispatcher not in _DISPATCHERS:
            check_choice("moe_dispatcher", self.moe_dispatcher)
        if self.pp_schedule not in _SCHEDULES:
            check_choice("pp_schedule", self.pp_schedule)
        if self.ep_overlap is not False and self.ep_overlap is not True:
            object.__setattr__(self, "ep_overlap", check_choice("ep_overlap", self.ep_overlap))
        if self.recompute not in _CANONICAL_SEEN:
            canonical = check_choice("recompute", self.recompute)
            if canonical != self.recompute:
                object.__setattr__(self, "recompute", canonical)
            else:
                _CANONICAL_SEEN.add(canonical)

    def derive(self, world: int, gbs: int) -> TrainingConfig:
        """Return a copy with ``dp`` and ``num_microbatches`` filled (0 where the division is not whole)."""
        inner = self.tp * self.cp * self.pp
        dp = world // inner if world % inner == 0 else 0
        m = gbs // (self.mbs * dp) if dp and gbs % (self.mbs * dp) == 0 else 0
        # direct construction over AXES (dataclasses.replace is several times slower; spaces derive in bulk)
        return TrainingConfig(**{a: getattr(self, a) for a in AXES}, dp=dp, num_microbatches=m)

    def replace(self, **changes: Any) -> TrainingConfig:
        """A copy with some axes changed (derived fields must be re-derived)."""
        return dataclasses.replace(self, dp=0, num_microbatches=0, **changes)

    def to_params(self) -> dict[str, Any]:
        """The ten axes as a dict (Optuna parameter names)."""
        return {a: getattr(self, a) for a in AXES}

    def to_dict(self) -> dict[str, Any]:
        """Axes plus the derived ``dp`` and ``num_microbatches``; each ``None`` where it is not derived or the
        division is not whole (an illegal configuration has no data-parallel size, not a size of 0)."""
        return {
            **self.to_params(),
            "dp": self.dp or None,
            "num_microbatches": self.num_microbatches or None,
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TrainingConfig:
        """Build from a dict of axes, validating names and types (``dp``/``num_microbatches`` are ignored)."""
        kwargs: dict[str, Any] = {}
        for key, value in params.items():
            if key in ("dp", "num_microbatches"):
                continue
            if key not in AXES:
                raise SpecError(f"unknown axis {key!r}; axes are {', '.join(AXES)}")
            if key in INT_AXES:
                try:
                    iv = int(value)
                except (TypeError, ValueError):
                    raise SpecError(f"{key} must be a positive integer, got {value!r}") from None
                if iv <= 0 or (isinstance(value, float) and value != iv):
                    raise SpecError(f"{key} must be a positive integer, got {value!r}")
                kwargs[key] = iv
            else:
                kwargs[key] = check_choice(key, value)
        return cls(**kwargs)

    def key(self) -> str:
        """A short, stable, human-readable identifier, e.g. ``tp1-pp4-ep8-cp1-vpp2-mbs2-none-alltoall-interleaved``."""
        return (
            f"tp{self.tp}-pp{self.pp}-ep{self.ep}-cp{self.cp}-vpp{self.vpp}-mbs{self.mbs}-"
            f"{self.recompute}-{self.moe_dispatcher}-{self.pp_schedule}"
            + ("-epoverlap" if self.ep_overlap else "")
        )

    def __str__(self) -> str:
        return (
            f"TP{self.tp} PP{self.pp} VPP{self.vpp} EP{self.ep} CP{self.cp} MBS{self.mbs} "
            f"recompute={self.recompute} dispatcher={self.moe_dispatcher} schedule={self.pp_schedule}"
            + (" ep_overlap" if self.ep_overlap else "")
        )


def _slot_setter(name: str) -> Any:
    return TrainingConfig.__dict__[name].__set__


_new = object.__new__
(_s_tp, _s_pp, _s_ep, _s_cp, _s_vpp, _s_mbs, _s_rc, _s_md, _s_ps, _s_eo, _s_dp, _s_m) = (
    _slot_setter(f.name) for f in dataclasses.fields(TrainingConfig)
)


def passes_checks(axis: str, value: Any) -> bool:
    """Whether :class:`TrainingConfig` accepts ``value`` for ``axis`` and stores it unchanged."""
    try:
        return getattr(TrainingConfig(**{axis: value}), axis) is value
    except ValueError:
        return False


def prechecked_config(
    tp: int,
    pp: int,
    ep: int,
    cp: int,
    vpp: int,
    mbs: int,
    recompute: str,
    moe_dispatcher: str,
    pp_schedule: str,
    ep_overlap: bool,
    dp: int,
    num_microbatches: int,
) -> TrainingConfig:
    """``TrainingConfig(tp, ..., num_microbatches)`` for values that each pass its checks unchanged
    (:func:`passes_checks`): the same object (equal, same hash and repr), built without re-running the checks
    (bulk enumeration; about 1 µs instead of 2.5)."""
    c = _new(TrainingConfig)
    _s_tp(c, tp)
    _s_pp(c, pp)
    _s_ep(c, ep)
    _s_cp(c, cp)
    _s_vpp(c, vpp)
    _s_mbs(c, mbs)
    _s_rc(c, recompute)
    _s_md(c, moe_dispatcher)
    _s_ps(c, pp_schedule)
    _s_eo(c, ep_overlap)
    _s_dp(c, dp)
    _s_m(c, num_microbatches)
    return c


def parse_config_string(text: str) -> dict[str, Any]:
    """Parse ``tp=1,pp=4,recompute=full`` into a dict of axes (values validated by :meth:`from_params`).

    Example::

        parse_config_string("tp=2, mbs=4")  # {'tp': 2, 'mbs': 4}
    """
    out: dict[str, Any] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise SpecError(f"--config: {part!r} is not KEY=VALUE; write e.g. --config tp=1,pp=4,mbs=2")
        key, value = (s.strip() for s in part.split("=", 1))
        if key not in AXES:
            raise SpecError(f"--config: unknown axis {key!r}; axes are {', '.join(AXES)}")
        if key in out:
            raise SpecError(f"--config: {key} is given twice ({out[key]} and {value}); give each axis once")
        out[key] = value
    try:
        clean = TrainingConfig.from_params(out)
    except SpecError as exc:
        raise SpecError(
            f"--config: {exc}; separate axes with commas, e.g. --config tp=1,pp=4,mbs=2"
        ) from None
    return {k: getattr(clean, k) for k in out}
