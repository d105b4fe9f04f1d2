""":class:`TrainingConfig`: one point of the search space (frozen, hashable).

The axes (:mod:`primus_optuna.spec.axes`) are the product's interface (Optuna parameter names, YAML keys, CLI flags). ``dp`` and
``num_microbatches`` are derived from the cluster size and global batch and are not part of equality.

Example::

    c = TrainingConfig(tp=1, pp=4, ep=8, vpp=2, mbs=2, pp_schedule="interleaved").derive(world=64, gbs=512)
    c.dp, c.num_microbatches  # (16, 16)
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

from ..errors import SpecError
from ..spec.axes import AXIS_LIST, REGISTRY, TEXT_ORDER
from ..spec.study import AXES, INT_AXES, check_choice

_ALLOWED: tuple[tuple[str, frozenset[Any]], ...] = tuple(
    (a.name, frozenset(a.choices)) for a in AXIS_LIST if a.kind == "choice" and a.canonical is None
)
"""choice axes checked by membership"""
_BOOLS: tuple[str, ...] = tuple(a.name for a in AXIS_LIST if a.kind == "bool")
_CANONICAL: tuple[str, ...] = tuple(a.name for a in AXIS_LIST if a.canonical is not None)
"""choice axes stored in canonical form (``recompute``)"""
_ALWAYS: tuple[str, ...] = tuple(a.name for a in AXIS_LIST if not a.optional)
_OPTIONAL: tuple[tuple[str, Any], ...] = tuple((a.name, a.default) for a in AXIS_LIST if a.optional)
_CANONICAL_SEEN: dict[str, set[Any]] = {a: set() for a in _CANONICAL}
"""values already checked to be canonical (validation stays O(1) in bulk enumeration)"""


class _ConfigMethods:
    """The behaviour of :class:`TrainingConfig`; its fields are the axes of :mod:`primus_optuna.spec.axes`."""

    __slots__ = ()

    def __post_init__(self) -> None:
        # categorical axes: a SpecError (ValueError) naming the field and the allowed values; recompute is
        # stored in canonical form (module order, ``selective:core_attn`` → ``selective``)
        for name, allowed in _ALLOWED:
            if getattr(self, name) not in allowed:
                check_choice(name, getattr(self, name))
        for name in _BOOLS:
            value = getattr(self, name)
            if value is not False and value is not True:
                object.__setattr__(self, name, check_choice(name, value))
        for name in _CANONICAL:
            value, seen = getattr(self, name), _CANONICAL_SEEN[name]
            if value not in seen:
                canonical = check_choice(name, value)
                if canonical != value:
                    object.__setattr__(self, name, canonical)
                else:
                    seen.add(canonical)

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
        """The axes as a dict (Optuna parameter names); an optional axis only when it is not at its default (a
        configuration of a study that does not search it reads the same as before the axis existed)."""
        out = {a: getattr(self, a) for a in _ALWAYS}
        for a, default in _OPTIONAL:
            if getattr(self, a) != default:
                out[a] = getattr(self, a)
        return out

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
        return "-".join(p for p in (a.key_part(getattr(self, a.name)) for a in AXIS_LIST) if p)

    def __str__(self) -> str:
        return " ".join(p for p in (REGISTRY[a].text_part(getattr(self, a)) for a in TEXT_ORDER) if p)


TrainingConfig = dataclasses.make_dataclass(
    "TrainingConfig",
    [
        *((a.name, a.python_type, field(default=a.default)) for a in AXIS_LIST),
        ("dp", int, field(default=0, compare=False, repr=False)),
        ("num_microbatches", int, field(default=0, compare=False, repr=False)),
    ],
    bases=(_ConfigMethods,),
    namespace={"__module__": __name__},
    frozen=True,
    slots=True,
)
TrainingConfig.__doc__ = """Parallel layout and training options of one trial: one field per axis
(:data:`~primus_optuna.spec.axes.REGISTRY`), plus ``dp`` = world / (tp·cp·pp) and ``num_microbatches`` =
GBS / (mbs·dp), each 0 when not derived or not whole (not part of equality)."""


def _slot_setter(name: str) -> Any:
    return TrainingConfig.__dict__[name].__set__


_new = object.__new__
_SETTERS = tuple(_slot_setter(f.name) for f in dataclasses.fields(TrainingConfig))


def passes_checks(axis: str, value: Any) -> bool:
    """Whether :class:`TrainingConfig` accepts ``value`` for ``axis`` and stores it unchanged."""
    try:
        return getattr(TrainingConfig(**{axis: value}), axis) is value
    except ValueError:
        return False


def prechecked_config(*values: Any) -> TrainingConfig:
    """``TrainingConfig(*values)`` (the axes in field order, then dp and num_microbatches) for values that each
    pass its checks unchanged (:func:`passes_checks`): the same object (equal, same hash and repr), built
    without re-running the checks (bulk enumeration)."""
    c = _new(TrainingConfig)
    for setter, value in zip(_SETTERS, values, strict=True):
        setter(c, value)
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
