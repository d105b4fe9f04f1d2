"""The audit report of a study (being split into modules; everything lives in :mod:`.sections` for now)."""

from .sections import *  # noqa: F403
from .sections import (
    StudyRecord,
    build_report,
    default_report_dir,
    fmt_gib,
    fmt_pct,
    fmt_tok,
    gain,
    gpu_hours_saved,
    load_record,
    record_of,
)

__all__ = [
    "StudyRecord",
    "build_report",
    "default_report_dir",
    "fmt_gib",
    "fmt_pct",
    "fmt_tok",
    "gain",
    "gpu_hours_saved",
    "load_record",
    "record_of",
]
