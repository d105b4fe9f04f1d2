"""Retry a failed point once: the oldest configuration whose only trial failed (not out of memory, not a retry
itself) is proposed again, with ``retry_of`` (the failed trial's number) and its original phase and sweep
attrs (a failed baseline is still the baseline). Interrupted trials (Ctrl-C, SIGTERM) are re-run this way in
the Python API too.
"""

from __future__ import annotations

from ..attrs import FAILURE_REASON
from .base import Context, Proposal

KEPT = ("sweep_index", "sweep_axis", "sweep_value")


class Retry:
    name = "retry"

    def propose(self, ctx: Context) -> Proposal | None:
        for config, failed in ctx.state.retry:
            if config in ctx.exclude or not ctx.allowed(config):
                continue
            ua = failed.user_attrs
            why = ua.get(FAILURE_REASON) or "failed"
            extra = {k: ua[k] for k in KEPT if k in ua} | {"retry_of": failed.number}
            return Proposal(
                config,
                str(ua.get("phase") or "retry"),
                "retry",
                f"retry of trial {failed.number} ({why}), once: " + str(ua.get("rationale", "")),
                extra,
            )
        return None
