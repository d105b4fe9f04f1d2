""":class:`Space`: the candidate values of each axis, legality, canonical forms and fast enumeration.

Example::

    space = Space(StudySpec.from_yaml("studies/mixtral-8x22b-mi355x-fp8.yaml"))
    space.check(space.baseline)   # [] -> legal
    len(space.configs())          # every legal canonical configuration
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from functools import cached_property
from typing import Any

from ..errors import SpecError
from ..spec.axes import ENUM_ORDER, REGISTRY, unused_optional
from ..spec.recompute import parse_recompute
from ..spec.study import AXES, CHOICES, DENSE_RECOMPUTE, MOE_RECOMPUTE, StudySpec
from .config import TrainingConfig, passes_checks, prechecked_config
from .megatron_args import ZERO_BUBBLE, uses_primus
from .rules import RULES, Facts, Rule, layers_per_chunk
from .torchtitan_args import AC_MODES, SCHEDULES

DEFAULT_MBS = (1, 2, 4, 8)
MAX_DEFAULT_VPP = 8


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class _Recompute:
    """A stand-in configuration for the recompute rules (they read ``recompute`` only)."""

    __slots__ = ("recompute",)

    def __init__(self, recompute: str) -> None:
        self.recompute = recompute


def _recompute_order(value: str) -> tuple[int, int]:
    """Decreasing memory: none, selective variants, full:N by N, full."""
    r = parse_recompute(value)
    if r.is_full:
        return (2, r.num_layers or 10**9)
    return (1, 0) if r.modules else (0, 0)


def _insert_in_order(axis: str, values: list[Any], value: Any) -> list[Any]:
    """``values`` with ``value`` added where it belongs: sorted for integer axes, by decreasing memory for
    recompute, last for the other categorical axes."""
    if axis == "recompute":
        key = _recompute_order(value)
        i = next((k for k, v in enumerate(values) if _recompute_order(v) > key), len(values))
        return [*values[:i], value, *values[i:]]
    if axis in CHOICES:
        return [*values, value]
    return sorted([*values, value])


def _single_axis_filtered(facts: Facts, axis: str, values: list[Any], rules: list[Rule]) -> list[Any]:
    """The candidate values of ``axis`` that no rule reading ``axis`` alone rejects (in order)."""
    if not rules:
        return values
    out = []
    for v in values:
        p = _Partial()
        setattr(p, axis, v)
        if not any(rule.fn(facts, p) for rule in rules):
            out.append(v)
    return out


class _Partial:
    """Mutable stand-in for a configuration while enumerating (rules read attributes only)."""

    __slots__ = AXES


TITAN_CANDIDATES: dict[str, Any] = {
    "recompute": lambda f: list(AC_MODES),
    "pp_schedule": lambda f: list(SCHEDULES),
    "moe_dispatcher": lambda f: ["alltoall"],
    "ep_overlap": lambda f: [False],
    "dp_shard": lambda f: _divisors(f.world),
}
"""A TorchTitan study's default candidates: its activation-checkpointing modes and schedules, no DeepEP or EP
overlap, and every sharding degree (FSDP over dp, or HSDP; ``dp_shard`` = 1 is DDP there, rule ``titan_ddp``)."""


class Space:
    """The legal, canonical configurations of a study."""

    def __init__(self, spec: StudySpec) -> None:
        self.spec = spec
        self.facts = Facts.of(spec)
        self.candidates: dict[str, list[Any]] = {a: self._default_candidates(a) for a in AXES}
        for axis, values in spec.search.axes.items():
            self.candidates[axis] = sorted(values) if axis not in CHOICES else list(values)
        self._refuse_inapplicable_recompute()
        self.baseline_added: dict[str, Any] = {}
        """baseline values that were not default candidates and joined them, so the sweep starts from what the
        user runs today (an axis restricted by ``search.axes`` keeps exactly the values listed)"""
        for axis in AXES:
            value = getattr(self.baseline_raw, axis)
            if axis not in spec.search.axes and value not in self.candidates[axis]:
                self.candidates[axis] = _insert_in_order(axis, self.candidates[axis], value)
                self.baseline_added[axis] = value

    def _refuse_inapplicable_recompute(self) -> None:
        """A recompute value written in the study file (``search.axes.recompute``, the baseline) that names a
        module this model does not have is a study-file error, not a silently dropped candidate."""
        rule = next(r for r in RULES if r.id == "recompute_modules")
        written = [("search.axes.recompute", v) for v in self.spec.search.axes.get("recompute", [])]
        written.append(("search.baseline.recompute", self.spec.search.baseline.recompute))
        for where, value in written:
            why = rule.fn(self.facts, _Recompute(value))
            if why:
                raise SpecError(
                    f"{where}: {value!r} does not apply to {self.spec.model.name}: "
                    f"{why.split(': ', 1)[-1]}; remove it or pick a value from "
                    f"{', '.join(self._default_candidates('recompute'))}"
                )

    # --- candidates and canonical form ---------------------------------------------------------------------
    def _default_candidates(self, axis: str) -> list[Any]:
        f, spec = self.facts, self.spec
        gpn = spec.cluster.gpus_per_node
        if f.torchtitan and axis in TITAN_CANDIDATES:  # what TorchTitan runs (rules titan_*)
            return TITAN_CANDIDATES[axis](f)
        if axis == "tp":
            return [d for d in _divisors(f.world) if d <= f.max_tp]
        if axis == "pp":
            return [d for d in _divisors(f.world) if d <= f.layers]
        if axis == "cp":
            return [d for d in _divisors(f.world) if d <= gpn]
        if axis == "ep":
            return _divisors(f.experts) if f.is_moe else [1]
        if axis == "vpp":
            pipe = spec.pipeline
            if pipe.layout is not None:  # the layout fixes pp·vpp
                return [d for d in _divisors(pipe.layout_chunks or 1) if d <= MAX_DEFAULT_VPP]
            if not pipe.is_default:  # uneven splits: the pipeline rules decide
                return list(range(1, MAX_DEFAULT_VPP + 1))
            return [d for d in _divisors(f.layers) if d <= MAX_DEFAULT_VPP]
        if axis == "mbs":
            return [b for b in DEFAULT_MBS if b <= f.gbs]
        if axis == "moe_dispatcher":
            return list(CHOICES[axis]) if f.is_moe else ["alltoall"]
        if axis == "ep_overlap":
            return [False, True] if f.is_moe else [False]
        if axis == "pp_schedule" and not uses_primus(spec):
            # zero bubble exists only in Primus (AMD GPUs): elsewhere the schedules upstream Megatron-LM runs
            return [s for s in CHOICES[axis] if s not in ZERO_BUBBLE]
        if axis == "recompute":  # decreasing memory order: the sweep walks the axis in this order
            values = list(MOE_RECOMPUTE if f.is_moe else DENSE_RECOMPUTE)
            if f.mla:  # MLA's Q, K, V (up-projection outputs) are its largest kept tensors; the published
                # DeepSeek-V3 recipes recompute them (mla_up_proj)
                values.insert(values.index("selective:moe") if f.is_moe else 1, "selective:mla_up_proj")
            return values
        declared = REGISTRY[axis].candidates
        if declared is not None:
            return declared(f)
        return list(CHOICES[axis])

    def canonical(self, config: TrainingConfig) -> TrainingConfig:
        """One representation per physical configuration, with ``dp``/``num_microbatches`` derived.

        pp=1 → vpp=1 and 1f1b; interleaved with vpp=1 → 1f1b; a dense model → ep=1, alltoall, no ep_overlap;
        ``full:N`` with N ≥ the layers of a virtual pipeline chunk → ``full``.
        """
        changes: dict[str, Any] = {}
        n = parse_recompute(config.recompute).num_layers
        if n and n >= layers_per_chunk(self.facts.layers, config.pp, config.vpp):
            changes["recompute"] = "full"
        if config.pp == 1:
            changes.update(vpp=1, pp_schedule="1f1b")
        elif config.pp_schedule == "interleaved" and config.vpp == 1:
            changes["pp_schedule"] = "1f1b"
        if not self.facts.is_moe:
            changes.update(ep=1, moe_dispatcher="alltoall", ep_overlap=False)
        c = config.replace(**changes) if changes else config
        return c.derive(self.facts.world, self.facts.gbs)

    def make(self, **axes: Any) -> TrainingConfig:
        """A derived (not canonicalised) configuration from axis values; missing axes come from the baseline."""
        if not axes:
            return self.baseline
        return self._titan_shard(
            self.baseline_raw.replace(**axes).derive(self.facts.world, self.facts.gbs), axes
        )

    def _titan_shard(self, c: TrainingConfig, given: Any) -> TrainingConfig:
        """In a TorchTitan study a ``dp_shard`` of 1 in the baseline, or not among the axes ``given``, is
        TorchTitan's default, the ranks left over (``data_parallel_shard_degree = -1``,
        torchtitan/config/configs.py@0.3.0:124-132): FSDP over dp (dp_shard 1 with dp > 1 would be DDP, which
        the ``titan_ddp`` rule refuses)."""
        if not self.facts.torchtitan or "dp_shard" in given or c.dp_shard != 1 or c.dp <= 1:
            return c
        return c.replace(dp_shard=c.dp).derive(self.facts.world, self.facts.gbs)

    @cached_property
    def searched_axes(self) -> tuple[str, ...]:
        """The axes this study searches: every axis but an optional one offered at its default only (not
        suggested, hashed or asked of the planner; it reads as its default)."""
        return tuple(a for a in AXES if not unused_optional(a, self.candidates[a]))

    @cached_property
    def baseline_raw(self) -> TrainingConfig:
        return TrainingConfig.from_params(self.spec.search.baseline.model_dump())

    @cached_property
    def baseline(self) -> TrainingConfig:
        """The study's baseline, derived but as written (it may be illegal: see :meth:`check`)."""
        return self._titan_shard(self.baseline_raw.derive(self.facts.world, self.facts.gbs), ())

    # --- legality -------------------------------------------------------------------------------------------
    def check(self, config: TrainingConfig) -> list[str]:
        """Every rule the configuration (as given) violates, as human reasons; empty means legal."""
        return [r for r in (rule.fn(self.facts, config) for rule in RULES) if r]

    def is_legal(self, config: TrainingConfig) -> bool:
        return not self.check(config)

    def __contains__(self, config: object) -> bool:
        return isinstance(config, TrainingConfig) and config in self._config_set

    # --- enumeration ----------------------------------------------------------------------------------------
    def configs(self) -> list[TrainingConfig]:
        """Every legal canonical configuration (cached). Raises :class:`SpecError` when there is none."""
        configs = self._configs
        if not configs:
            raise SpecError(self.explain_empty())
        return configs

    def adopt_enumeration(self, other: Space) -> bool:
        """Take ``other``'s enumeration (:meth:`configs`, the same list) when it enumerates the same space: the
        same facts, model, pipeline layout and candidates, all that the rules and the enumeration read. True when
        taken (e.g. one cluster size of two GPU types alike in node size and launcher)."""
        if (
            self.facts != other.facts
            or self.candidates != other.candidates
            or self.spec.model != other.spec.model
            or self.spec.pipeline != other.spec.pipeline
        ):
            return False
        self.__dict__["_configs"] = other._configs
        return True

    @property
    def empty(self) -> bool:
        """Whether no configuration is legal (:meth:`explain_empty` says why; :meth:`configs` raises it)."""
        return not self._configs

    @cached_property
    def _configs(self) -> list[TrainingConfig]:
        return self._enumerate_list()

    @cached_property
    def _config_set(self) -> frozenset[TrainingConfig]:
        return frozenset(self._configs)

    def _enumerate(self) -> Iterator[TrainingConfig]:
        yield from self._enumerate_list()

    def _enumerate_list(self) -> list[TrainingConfig]:
        """Depth-first over :data:`ENUM_ORDER`, each rule applied at the level that fixes its last axis;
        the leaves are built already derived (``dp``, ``num_microbatches``) as :meth:`TrainingConfig.derive`
        computes them.

        Same configurations in the same order, with less work: a rule that reads one axis only filters that
        axis's candidates once, and when the last level's rules do not read the level above, the last axis's
        legal values are found once per node above that level instead of once per value of it."""
        levels: list[list[Rule]] = [[] for _ in ENUM_ORDER]
        for rule in RULES:
            levels[max(ENUM_ORDER.index(a) for a in rule.axes)].append(rule)
        facts, world, gbs = self.facts, self.facts.world, self.facts.gbs
        cands = [
            _single_axis_filtered(facts, a, self.candidates[a], [r for r in rules if r.axes == (a,)])
            for a, rules in zip(ENUM_ORDER, levels, strict=True)
        ]
        fns = [
            tuple(rule.fn for rule in rules if rule.axes != (a,))
            for a, rules in zip(ENUM_ORDER, levels, strict=True)
        ]
        p = _Partial()
        # the leaf's constructor arguments, in TrainingConfig's field order (AXES, then dp, num_microbatches)
        slot = [AXES.index(a) for a in ENUM_ORDER]
        args: list[Any] = [None] * (len(AXES) + 2)
        i_tp, i_cp, i_pp, i_mbs = (AXES.index(a) for a in ("tp", "cp", "pp", "mbs"))
        # dp and num_microbatches as TrainingConfig.derive computes them, once the axes they read are fixed
        derive_at = max(ENUM_ORDER.index(a) for a in ("tp", "cp", "pp", "mbs"))
        out: list[TrainingConfig] = []
        # every candidate as TrainingConfig stores it: the leaves skip its checks (else the checked constructor)
        make = (
            prechecked_config
            if all(passes_checks(a, v) for a, vs in zip(ENUM_ORDER, cands, strict=True) for v in vs)
            else TrainingConfig
        )
        last = len(ENUM_ORDER) - 1
        leaf_axis, leaf_rules, i_leaf = ENUM_ORDER[last], fns[last], slot[last]
        # the last axis's legal values depend only on the levels above the one before it
        leaf_reuse = derive_at < last and ENUM_ORDER[last - 1] not in {
            a for r in levels[last] for a in r.axes
        }

        def leaf_values() -> list[Any]:
            legal = []
            for v in cands[last]:
                setattr(p, leaf_axis, v)
                if not any(fn(facts, p) for fn in leaf_rules):
                    legal.append(v)
            return legal

        def rec(k: int) -> None:
            axis, rules, i = ENUM_ORDER[k], fns[k], slot[k]
            leaves = leaf_values() if leaf_reuse and k == last - 1 else None
            for v in cands[k]:
                setattr(p, axis, v)
                broken = False
                for fn in rules:
                    if fn(facts, p):
                        broken = True
                        break
                if broken:
                    continue
                args[i] = v
                if k == derive_at:
                    inner = args[i_tp] * args[i_cp] * args[i_pp]
                    dp = world // inner if world % inner == 0 else 0
                    mb = args[i_mbs] * dp
                    args[-2] = dp
                    args[-1] = gbs // mb if dp and gbs % mb == 0 else 0
                if leaves is not None:
                    for lv in leaves:
                        args[i_leaf] = lv
                        out.append(make(*args))
                elif k < last:
                    rec(k + 1)
                else:
                    out.append(make(*args))

        rec(0)
        return out

    def product(self) -> Iterator[TrainingConfig]:
        """The raw Cartesian product of the candidate values (legal or not)."""
        for values in itertools.product(*(self.candidates[a] for a in AXES)):
            yield TrainingConfig(**dict(zip(AXES, values, strict=True)))

    def legal_values(self) -> dict[str, list[Any]]:
        """For each axis, the candidate values that appear in at least one legal configuration (a new dict
        of new lists each call; computed once: every trial's parameters are offered over them)."""
        return {a: list(v) for a, v in self._legal_values.items()}

    @cached_property
    def _legal_values(self) -> dict[str, tuple[Any, ...]]:
        seen: dict[str, set[Any]] = {a: set() for a in AXES}
        for c in self._configs:
            for a in AXES:
                seen[a].add(getattr(c, a))
        return {a: tuple(v for v in self.candidates[a] if v in seen[a]) for a in AXES}

    def axis_warnings(self) -> list[str]:
        """One line per value written in ``search.axes`` that no legal configuration has (it is left out of the
        search), with a rule that rejects it next to the baseline: ``search.axes.tp: 3 is in no legal
        configuration (tp=3 does not divide the 64 attention heads); it is left out of the search``; and one
        when an even split leaves pp=1 only (DeepSeek-V3's 61 layers without a pipeline section)."""
        legal = self._legal_values
        out = []
        for axis, values in self.spec.search.axes.items():
            for v in values:
                if v in legal[axis]:
                    continue
                reasons = self.check(self.canonical(self.make(**{**self.baseline.to_params(), axis: v})))
                why = next((r for r in reasons if axis in r), reasons[0] if reasons else "")
                out.append(
                    f"search.axes.{axis}: {v} is in no legal configuration"
                    + (f" ({why})" if why else " (no combination with the other axes' values is legal)")
                    + "; it is left out of the search"
                )
        pp = self.candidates["pp"]
        if "pp" not in self.spec.search.axes and self.spec.pipeline.is_default and len(pp) > 1:
            if list(legal["pp"]) == [1]:
                out.append(
                    f"pp: only pp=1 is legal: no pp in {', '.join(map(str, pp[1:]))} divides the model's "
                    f"{self.spec.model.num_layers} layers evenly; add a pipeline section "
                    "(decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers, or a layout) to "
                    "search pipeline parallelism"
                )
        return out

    def elimination_counts(self, limit: int = 500_000) -> Counter[str]:
        """How many points of the Cartesian product each rule rejects (for diagnostics)."""
        counts: Counter[str] = Counter()
        for c in itertools.islice(self.product(), limit):
            for rule in RULES:
                if rule.fn(self.facts, c):
                    counts[rule.id] += 1
        return counts

    def explain_empty(self, limit: int = 500_000) -> str:
        """Why the space is empty, naming the rules that actually block: those every combination breaks
        (relaxing any other rule cannot help), else those that alone reject a combination (relaxing one of
        them would admit it), else the ones that reject the most."""
        total = 1
        for a in AXES:
            total *= len(self.candidates[a])
        every: set[str] | None = None
        alone: Counter[str] = Counter()
        counts: Counter[str] = Counter()
        example: dict[str, tuple[str, TrainingConfig]] = {}
        for c in itertools.islice(self.product(), limit):
            broken = {}
            for rule in RULES:
                why = rule.fn(self.facts, c)
                if why:
                    broken[rule.id] = why
                    counts[rule.id] += 1
                    example.setdefault(rule.id, (why, c))
            every = set(broken) if every is None else every & set(broken)
            if len(broken) == 1:
                alone[next(iter(broken))] += 1

        def named(rid: str) -> str:
            why, c = example[rid]
            return f"{rid} ({why}, e.g. {c.key()})"

        if every:
            order = sorted(every, key=lambda r: [x.id for x in RULES].index(r))
            detail = "every combination breaks " + "; ".join(named(r) for r in order)
        elif alone:
            detail = "the rules that alone reject otherwise-legal combinations: " + "; ".join(
                f"{named(r)} rejects {n}" for r, n in alone.most_common(3)
            )
        else:
            detail = "no single rule blocks; the rules that reject the most: " + "; ".join(
                f"{named(r)} rejects {n} of {total}" for r, n in counts.most_common(3)
            )
        return (
            f"study {self.spec.name!r} has no legal configuration among the {total} combinations of "
            f"search.axes; {detail}. Widen search.axes or change the cluster/workload."
        )

    def summary(self) -> dict[str, Any]:
        """The ``space --json`` document."""
        base = self.baseline
        return {
            "axes": self.legal_values(),
            "legal_configs": len(self.configs()),
            "baseline": {
                "config": base.to_params(),
                "legal": not self.check(base),
                "reasons": self.check(base),
            },
        }
