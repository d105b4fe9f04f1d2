"""The cluster's measured collectives (``cluster.network``): nccl-tests / rccl-tests logs or a plain CSV.

A study names one file or a list (relative to the study file); :func:`load_network` reads them into a
:class:`NetworkSpec`, one row per (collective, ranks, ranks per node, bytes) with its bus bandwidth, which the
study keeps (and stores: a stored study never needs the files again; their content enters the space hash).

**nccl-tests / rccl-tests logs** (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``,
``alltoall_perf``, ``sendrecv_perf``), their standard output as printed (NVIDIA/nccl-tests at a0b82b22;
rccl-tests, its fork, prints the same lines):

- the header ``# nThread 1 nGpus 1 minBytes 8 maxBytes ... step: 2(factor) ...`` (``src/util.cu@a0b82b22``:625), preceded
  in recent versions by ``# Collective test starting: all_reduce_perf`` (``src/util.cu@a0b82b22``:624), which names the
  collective (older logs: the file name must name the binary, e.g. ``all_reduce_perf_16n.log``);
- one ``#  Rank  0 Group  0 Pid  1234 on     node01 device  0 [0000:18:00] NVIDIA H100 80GB HBM3`` line per
  rank (``src/util.cu@a0b82b22``:687): the ranks of one group (``NCCL_TESTS_SPLIT`` runs several groups side by side, each
  measured on its own) and, from the host names, how many of them share a node;
- the two column-header lines (``src/util.cu@a0b82b22``:756-760: ``size count type redop root`` then ``time algbw busbw
  #wrong`` for out-of-place and again for in-place; older versions have no ``root`` and call the last column
  ``error``), located by name, then one row per message size (``src/util.cu@a0b82b22``:457, 508);
- ``# Avg bus bandwidth : ...`` and ``# Collective test concluded: ...`` (``src/util.cu@a0b82b22``:778-780) close it.

Per row the bus bandwidth is taken from the measured time (more digits than the printed ``busbw`` at small
sizes), with nccl-tests' own formula: ``algbw = size / time`` and ``busbw = algbw · 2(n−1)/n`` for all-reduce,
``(n−1)/n`` for all-gather, reduce-scatter and all-to-all, ``1`` for send/receive (``src/all_reduce.cu@a0b82b22``
:59-65, ``src/all_gather.cu@a0b82b22``:38-44, ``src/reduce_scatter.cu@a0b82b22``:37-43,
``src/alltoall.cu@a0b82b22``:48-54, ``src/sendrecv.cu@a0b82b22``:38-44; ``doc/PERFORMANCE.md``), averaged over the out-of-place and in-place columns. ``size`` is the printed byte count:
the gathered (all-gather) or reduced (reduce-scatter) total, what one rank sends in all (all-to-all),
``src/common.cu@a0b82b22``:938 ``max(sendBytes, expectedBytes)``. Size-0 rows are skipped; a row whose ``#wrong`` is not 0
is refused (nccl-tests found corrupted results). Several logs may be concatenated in one file.

**CSV**: the header ``collective,ranks,ranks_per_node,bytes,busbw_gbs`` (any order), one row per
measurement, ``collective`` one of :data:`COLLECTIVES`; blank lines and ``#`` comments are skipped.

Repeated measurements of one point (several files, cycles or data types) are averaged.

Example::

    net = load_network(["net/all_reduce_perf_2n.log", "net/extra.csv"], base_dir="studies")
    net.rows[0]  # ("all_reduce", 16, 8, 1024.0, 0.0100...): collective, ranks, per node, bytes, GB/s
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import SpecError

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
"""the collectives a network file may measure (the collective model's names)"""

PROGRAMS: dict[str, str] = {
    "all_reduce_perf": "all_reduce",
    "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter",
    "alltoall_perf": "all_to_all",
    "sendrecv_perf": "send_recv",
}
"""nccl-tests / rccl-tests binaries and the collective each measures"""

CSV_COLUMNS: tuple[str, ...] = ("collective", "ranks", "ranks_per_node", "bytes", "busbw_gbs")

Row = tuple[str, int, int, float, float]
"""(collective, ranks, ranks per node, bytes, bus bandwidth GB/s)"""


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: ``busbw = algbw · factor`` (doc/PERFORMANCE.md)."""
    if collective == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if collective == "send_recv":
        return 1.0
    return (ranks - 1) / ranks


class NetworkSource(BaseModel):
    """One file a network was read from: its path as the study named it and its content's hash."""

    model_config = ConfigDict(extra="forbid")
    path: str
    sha256: str
    collectives: list[str]
    rows: int = Field(ge=0)


class NetworkSpec(BaseModel):
    """``cluster.network`` once read: its files and the measured points (:data:`Row`, averaged)."""

    model_config = ConfigDict(extra="forbid")
    sources: list[NetworkSource]
    rows: list[Row]

    def files(self, collective: str) -> list[str]:
        """The files that measured ``collective`` (empty: it is priced from the catalog)."""
        return [s.path for s in self.sources if collective in s.collectives]

    def describe(self) -> str:
        """One line: which collectives were measured (in which files), which come from the catalog."""
        parts = [f"{c} measured ({', '.join(self.files(c))})" for c in COLLECTIVES if self.files(c)]
        catalog = [c for c in COLLECTIVES if not self.files(c)]
        if catalog:
            parts.append(f"{', '.join(catalog)} from the catalog")
        return "; ".join(parts)


# --- nccl-tests logs -------------------------------------------------------------------------------------------
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_NTHREAD = re.compile(r"^#\s*nThread\s+\d+\s+nGpus\s+\d+")
_DEVICE = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]"
)
_INT = re.compile(r"^\d+$")


class _Section:
    """One test's output inside a log: its collective, devices (rank, group, host) and column layout."""

    def __init__(self, program: str | None) -> None:
        self.program = program
        self.devices: list[tuple[int, int, str]] = []
        self.columns: list[str] | None = None
        self.found: list[tuple[int, float, float]] = []
        """(line number, bytes, mean time µs) of each result row"""

    def scope(self, where: str) -> tuple[int, int]:
        """(ranks of one group, their most on one host), from the device lines."""
        if not self.devices:
            raise SpecError(
                f"{where}: no '#  Rank N Group G Pid P on HOST device D [...]' lines before the results; keep "
                "the header nccl-tests prints (the ranks and hosts come from it), or write the points as CSV"
            )
        groups: dict[int, list[str]] = {}
        for _, group, host in self.devices:
            groups.setdefault(group, []).append(host)
        sizes = {len(h) for h in groups.values()}
        if len(sizes) > 1:
            raise SpecError(
                f"{where}: the NCCL_TESTS_SPLIT groups have different sizes ({sorted(sizes)}); measure groups "
                "of one size per run"
            )
        hosts = next(iter(groups.values()))
        per_host = max(hosts.count(h) for h in set(hosts))
        return len(hosts), per_host


def _collective_of(program: str | None, path: Path, where: str) -> str:
    for name in (program or "", path.name):
        low = name.lower()
        for binary, coll in PROGRAMS.items():
            if binary in low:
                return coll
    raise SpecError(
        f"{where}: cannot tell which collective this log measured (no '# Collective test starting:' line and "
        f"the file name names no binary); name the file after it (e.g. all_reduce_perf_16n.log; one of "
        f"{', '.join(PROGRAMS)}) or keep the line nccl-tests prints"
    )


def _float(token: str, what: str, where: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise SpecError(f"{where}: {what} {token!r} is not a number; fix or remove the line") from None


def _result(sec: _Section, tokens: list[str], where: str) -> tuple[float, list[float]] | None:
    """(bytes, [time µs of the out-of-place and in-place columns]) of one result row; None for size 0."""
    cols = sec.columns or []
    times = [i for i, c in enumerate(cols) if c in ("time", "cputime")]
    wrong = [i for i, c in enumerate(cols) if c == "#wrong"]
    if not times:
        raise SpecError(
            f"{where}: the column header names no 'time' column; keep the header lines nccl-tests prints"
        )
    need = max(times + wrong) + 1
    if len(tokens) < need:
        raise SpecError(
            f"{where}: a result row with {len(tokens)} columns where the header names {need}; keep the rows "
            "as nccl-tests prints them"
        )
    size = _float(tokens[cols.index("size")], "size", where)
    for i in wrong:
        if tokens[i] not in ("0", "N/A"):
            raise SpecError(
                f"{where}: #wrong = {tokens[i]} (nccl-tests found corrupted results at this size); rerun the "
                "test or remove the line"
            )
    if size <= 0:
        return None
    out = [_float(tokens[i], "time", where) for i in times]
    if any(t <= 0 for t in out):
        raise SpecError(f"{where}: a time of 0 µs; fix or remove the line")
    return size, out


def parse_nccl_tests(text: str, path: Path) -> list[Row]:
    """The points of a nccl-tests / rccl-tests log (see the module docstring)."""
    sections: list[_Section] = []
    cur: _Section | None = None
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        where = f"{path}:{no}"
        if m := _STARTING.match(line):
            cur = _Section(m.group(1))
            sections.append(cur)
        elif _NTHREAD.match(line):
            if cur is None or cur.found or cur.devices:
                cur = _Section(None)
                sections.append(cur)
        elif m := _DEVICE.match(line):
            if cur is None:
                cur = _Section(None)
                sections.append(cur)
            cur.devices.append((int(m.group(1)), int(m.group(2) or 0), m.group(3)))
        elif line.startswith("#") and "size" in line.split() and "busbw" in line.split():
            if cur is None:
                cur = _Section(None)
                sections.append(cur)
            cur.columns = line.lstrip("#").split()
        elif cur is not None and cur.columns and line and _INT.match(line.split()[0]):
            got = _result(cur, line.split(), where)
            if got is not None:
                size, times = got
                cur.found.append((no, size, sum(times) / len(times)))
    rows: list[Row] = []
    for sec in sections:
        if not sec.found:
            continue
        first = sec.found[0][0]
        coll = _collective_of(sec.program, path, f"{path}:{first}")
        ranks, per_node = sec.scope(f"{path}:{first}")
        if ranks < 2:
            raise SpecError(
                f"{path}:{first}: the test ran on 1 rank; measure collectives on 2 or more GPUs (mpirun -np N)"
            )
        for _, size, t_us in sec.found:
            busbw = size / (t_us * 1e-6) / 1e9 * bus_factor(coll, ranks)
            rows.append((coll, ranks, per_node, size, busbw))
    if not rows:
        raise SpecError(
            f"{path}: no nccl-tests result rows (a '#  size  count  type ...  busbw' header then one row per "
            "size); give the test's standard output, or a CSV with the columns " + ",".join(CSV_COLUMNS)
        )
    return rows


# --- CSV -------------------------------------------------------------------------------------------------------
def _csv_int(value: str, column: str, where: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise SpecError(f"{where}: {column} {value!r} is not a whole number; fix the row") from None


def parse_csv(text: str, path: Path) -> list[Row]:
    """The points of a CSV with the columns :data:`CSV_COLUMNS`."""
    lines = [
        (no, ln)
        for no, ln in enumerate(text.splitlines(), 1)
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    if not lines:
        raise SpecError(
            f"{path}: empty; write the header {','.join(CSV_COLUMNS)} and one row per measurement"
        )
    reader = csv.reader(io.StringIO("\n".join(ln for _, ln in lines)))
    head = [h.strip() for h in next(reader)]
    missing = [c for c in CSV_COLUMNS if c not in head]
    extra = [h for h in head if h not in CSV_COLUMNS]
    if missing or extra:
        what = "; ".join(
            x
            for x in (
                f"missing {', '.join(missing)}" if missing else "",
                f"unknown {', '.join(extra)}" if extra else "",
            )
            if x
        )
        raise SpecError(
            f"{path}:{lines[0][0]}: header {','.join(head)!r}: {what}; the columns are {','.join(CSV_COLUMNS)}"
        )
    rows: list[Row] = []
    for (no, _), cells in zip(lines[1:], reader, strict=False):
        where = f"{path}:{no}"
        if len(cells) != len(head):
            raise SpecError(f"{where}: {len(cells)} values for {len(head)} columns; one value per column")
        rec = dict(zip(head, (c.strip() for c in cells), strict=True))
        coll = rec["collective"]
        if coll not in COLLECTIVES:
            raise SpecError(
                f"{where}: collective {coll!r} is not one of {', '.join(COLLECTIVES)}; use one of them"
            )
        ranks = _csv_int(rec["ranks"], "ranks", where)
        per_node = _csv_int(rec["ranks_per_node"], "ranks_per_node", where)
        nbytes = _float(rec["bytes"], "bytes", where)
        busbw = _float(rec["busbw_gbs"], "busbw_gbs", where)
        if ranks < 2 or not 1 <= per_node <= ranks:
            raise SpecError(
                f"{where}: ranks={ranks}, ranks_per_node={per_node}; a collective needs ranks >= 2 and "
                "1 <= ranks_per_node <= ranks"
            )
        if nbytes <= 0 or busbw <= 0:
            raise SpecError(
                f"{where}: bytes and busbw_gbs must be > 0 (got {rec['bytes']}, {rec['busbw_gbs']})"
            )
        rows.append((coll, ranks, per_node, nbytes, busbw))
    if not rows:
        raise SpecError(f"{path}: a header and no rows; add one row per measurement")
    return rows


# --- the study field -------------------------------------------------------------------------------------------
def _is_csv(path: Path, text: str) -> bool:
    if path.suffix.lower() == ".csv":
        return True
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")), "")
    return (
        first.replace(" ", "").startswith("collective,")
        or first.replace(" ", "").split(",")[0] in CSV_COLUMNS
    )


def _average(rows: Iterable[Row]) -> list[Row]:
    sums: dict[tuple[str, int, int, float], list[float]] = {}
    for coll, ranks, per_node, nbytes, busbw in rows:
        sums.setdefault((coll, ranks, per_node, nbytes), []).append(busbw)
    return [(*k, sum(v) / len(v)) for k, v in sorted(sums.items())]


def load_network(paths: str | list[str], base_dir: str | Path = ".") -> NetworkSpec:
    """Read ``cluster.network``: one path or a list, each a nccl-tests/rccl-tests log or a CSV."""
    names = [paths] if isinstance(paths, str) else list(paths)
    if not names or not all(isinstance(p, str) and p for p in names):
        raise SpecError(
            "cluster.network: give the path of a nccl-tests log or CSV, or a list of them (relative to the study "
            "file)"
        )
    sources, rows = [], []
    for name in names:
        path = Path(name)
        full = path if path.is_absolute() else Path(base_dir) / path
        try:
            data = full.read_bytes()
        except OSError as exc:
            raise SpecError(
                f"cluster.network: cannot read {str(full)!r} ({exc.strerror or exc}); give the path of a "
                "nccl-tests log or CSV relative to the study file"
            ) from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecError(
                f"cluster.network: {full} is not a UTF-8 text file; give the test's text output"
            ) from None
        got = parse_csv(text, full) if _is_csv(full, text) else parse_nccl_tests(text, full)
        colls = [c for c in COLLECTIVES if any(r[0] == c for r in got)]
        digest = hashlib.sha256(data).hexdigest()
        sources.append(NetworkSource(path=name, sha256=digest, collectives=colls, rows=len(got)))
        rows.extend(got)
    return NetworkSpec(sources=sources, rows=_average(rows))


def network_field(value: Any, base_dir: str | Path) -> Any:
    """``cluster.network`` as given: a path or list of paths is read now; a read network (a stored study's
    dict) passes through."""
    if value is None or isinstance(value, dict | NetworkSpec):
        return value
    return load_network(value, base_dir)
