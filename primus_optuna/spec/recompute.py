"""The ``recompute`` axis in Megatron-Core's own terms: parse, canonical form and Megatron arguments.

Values (strings; the Optuna parameter stays categorical):

- ``none``;
- ``selective``: Megatron's default module set (``core_attn``);
- ``selective:<modules>``: ``--recompute-modules`` joined by ``+`` in the canonical order of
  :data:`RECOMPUTE_MODULES`, e.g. ``selective:moe_act+layernorm``;
- ``full``: full granularity on every layer (``--recompute-method uniform --recompute-num-layers 1``);
- ``full:N``: full granularity, method ``block``, the first ``N`` layers of every virtual pipeline chunk.

Example::

    parse_recompute("selective:layernorm+moe_act").value  # 'selective:moe_act+layernorm'
    parse_recompute("full:1").megatron_args()["recompute_method"]  # 'block'
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import SpecError

RECOMPUTE_MODULES: tuple[str, ...] = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mlp",
    "moe",
    "shared_experts",
    "mla_up_proj",
)
"""Megatron-Core ``recompute_modules`` in canonical order."""
DEFAULT_MODULES: tuple[str, ...] = ("core_attn",)
"""Megatron-Core's default ``recompute_modules``."""
ALLOWED_TEXT = (
    "none, selective, selective:<modules joined by '+'> (modules: "
    + ", ".join(RECOMPUTE_MODULES)
    + "), full, full:N (N ≥ 1 layers per virtual pipeline chunk)"
)


@dataclass(frozen=True, slots=True)
class Recompute:
    """A parsed recompute value.

    ``granularity`` is ``none``, ``selective`` or ``full``; ``modules`` the selective modules (canonical
    order); ``num_layers`` the ``full:N`` block count (0 = every layer, uniform).
    """

    granularity: str
    modules: tuple[str, ...] = ()
    num_layers: int = 0

    @property
    def value(self) -> str:
        """The canonical string."""
        if self.granularity == "selective":
            if self.modules == DEFAULT_MODULES:
                return "selective"
            return "selective:" + "+".join(self.modules)
        if self.granularity == "full" and self.num_layers:
            return f"full:{self.num_layers}"
        return self.granularity

    @property
    def is_full(self) -> bool:
        return self.granularity == "full"

    def has(self, module: str) -> bool:
        return module in self.modules

    def megatron_args(self) -> dict[str, Any]:
        """``recompute_granularity/method/num_layers/modules`` (underscore names; ``None`` = not set)."""
        if self.granularity == "none":
            return {
                "recompute_granularity": None,
                "recompute_method": None,
                "recompute_num_layers": None,
                "recompute_modules": None,
            }
        if self.granularity == "selective":
            return {
                "recompute_granularity": "selective",
                "recompute_method": None,
                "recompute_num_layers": None,
                "recompute_modules": list(self.modules),
            }
        return {
            "recompute_granularity": "full",
            "recompute_method": "block" if self.num_layers else "uniform",
            "recompute_num_layers": self.num_layers or 1,
            "recompute_modules": None,
        }


def _error(value: Any, why: str) -> SpecError:
    return SpecError(f"recompute: {why} (got {value!r}); allowed values: {ALLOWED_TEXT}")


@lru_cache(maxsize=256)
def _parse(value: str) -> Recompute:
    text = value.strip()
    if text in ("none", "selective", "full"):
        if text == "selective":
            return Recompute("selective", DEFAULT_MODULES)
        return Recompute(text)
    kind, sep, rest = text.partition(":")
    if not sep or kind not in ("selective", "full"):
        raise _error(value, "unknown value")
    if kind == "full":
        try:
            n = int(rest)
        except ValueError:
            raise _error(value, f"full:N needs a whole number of layers, not {rest!r}") from None
        if n < 1:
            raise _error(value, "full:N needs N ≥ 1 (use none for no recompute)")
        return Recompute("full", num_layers=n)
    names = [m.strip() for m in rest.split("+")]
    unknown = [m for m in names if m not in RECOMPUTE_MODULES]
    if unknown or not names:
        raise _error(value, f"unknown recompute module(s) {', '.join(map(repr, unknown))}")
    if len(set(names)) != len(names):
        raise _error(value, "a module is listed twice")
    return Recompute("selective", tuple(m for m in RECOMPUTE_MODULES if m in names))


def parse_recompute(value: Any) -> Recompute:
    """Parse a recompute value; raises :class:`SpecError` (a ``ValueError``) naming the allowed values."""
    if not isinstance(value, str):
        raise _error(value, "must be a string")
    return _parse(value)


def canonical_recompute(value: Any) -> str:
    """The canonical spelling of a recompute value (module order, ``selective:core_attn`` → ``selective``)."""
    return parse_recompute(value).value


def recompute_from_megatron(
    granularity: Any,
    method: Any = None,
    num_layers: Any = None,
    modules: Any = None,
    layers_per_chunk: int | None = None,
) -> str:
    """The recompute value that Megatron's ``recompute_*`` arguments select (absent ones: defaults).

    ``full`` with 0 layers is off (Primus recipes write it so); ``uniform`` with N > 1 groups layers into runs
    of N (memory close to block N of N), mapped to ``full``; ``block`` with N ≥ the layers per chunk is
    ``full``.
    """
    if granularity in (None, "", "none", "null"):
        return "none"
    if granularity == "selective":
        if modules in (None, "", "null"):
            return "selective"
        if isinstance(modules, str):
            items = [m.strip() for m in modules.replace(",", " ").replace("+", " ").split()]
        else:
            items = [str(m).strip() for m in modules]
        if not items:
            return "none"  # an empty module list recomputes nothing (Bridge recipes write [])
        return parse_recompute("selective:" + "+".join(items)).value
    if granularity != "full":
        raise SpecError(
            f"recompute_granularity: {granularity!r} is not one of full, selective (or unset for none)"
        )
    try:
        n = int(num_layers) if num_layers not in (None, "") else 1
    except (TypeError, ValueError):
        raise SpecError(f"recompute_num_layers: {num_layers!r} is not a whole number") from None
    if n <= 0:
        return "none"
    if (method or "uniform") == "block":
        if layers_per_chunk is not None and n >= layers_per_chunk:
            return "full"
        return f"full:{n}"
    return "full"
