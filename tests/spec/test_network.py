"""``cluster.network``: nccl-tests / rccl-tests logs and the CSV, read into the study.

The logs under data/network/ follow nccl-tests' printf formats line for line (NVIDIA/nccl-tests@a0b82b22
``src/util.cu``:457, 508, 623-625, 687, 746-760, 777-780): header, one device line per rank, the two column
headers, the result rows and the footer; ``all_gather_perf_2n.log`` is the older form without the version and
``Collective test starting`` lines; ``sendrecv_split.log`` ran with ``NCCL_TESTS_SPLIT="MOD 8"`` (``Group`` =
rank % 8: eight groups of 2 ranks, one per node).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from primus_optuna.errors import SpecError
from primus_optuna.search.state import space_hash
from primus_optuna.spec import StudySpec
from primus_optuna.spec.network import load_network, parse_csv, parse_nccl_tests

DATA = Path(__file__).parent / "data" / "network"
STUDY = Path(__file__).parents[2] / "studies" / "llama3.1-70b-h100-bf16.yaml"


def _study(tmp_path: Path, network) -> Path:
    data = yaml.safe_load(STUDY.read_text())
    data["cluster"]["network"] = network
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_nccl_tests_log_gives_ranks_hosts_and_bus_bandwidth():
    rows = parse_nccl_tests((DATA / "all_reduce_perf_2n.log").read_text(), DATA / "all_reduce_perf_2n.log")
    assert len(rows) == 11  # 1 KiB .. 1 GiB, factor 4
    assert {r[:3] for r in rows} == {("all_reduce", 16, 8)}  # 16 device lines on 2 hosts
    big = rows[-1]
    assert big[3] == 2**30
    # from the time columns with nccl-tests' factor 2(n-1)/n: the printed busbw 91.20 / 89.84, averaged
    assert big[4] == pytest.approx((91.20 + 89.84) / 2, abs=0.05)


def test_old_log_names_its_collective_by_file_and_split_groups_give_the_scope():
    rows = parse_nccl_tests((DATA / "all_gather_perf_2n.log").read_text(), DATA / "all_gather_perf_2n.log")
    assert {r[:3] for r in rows} == {("all_gather", 16, 8)}
    split = parse_nccl_tests((DATA / "sendrecv_split.log").read_text(), DATA / "sendrecv_split.log")
    assert {r[:3] for r in split} == {("send_recv", 2, 1)}  # 8 groups of 2 ranks, one per node
    assert split[-1][4] == pytest.approx((21.00 + 20.79) / 2, abs=0.05)  # send/recv: busbw = algbw


def test_concatenated_logs_are_read_section_by_section():
    text = (DATA / "all_reduce_perf_2n.log").read_text() + (DATA / "all_reduce_perf_4n.log").read_text()
    rows = parse_nccl_tests(text, Path("both.log"))
    assert {r[1] for r in rows} == {16, 32}


def test_csv_rows_and_repeated_points_are_averaged():
    rows = parse_csv((DATA / "cloud.csv").read_text(), DATA / "cloud.csv")
    assert len(rows) == 21
    assert ("all_reduce", 64, 8, 1073741824.0, 11.0) in rows
    net = load_network(["cloud.csv", "all_reduce_perf_2n.log"], DATA)
    both = [r for r in net.rows if r[:4] == ("all_reduce", 16, 8, 2.0**30)]
    assert len(both) == 1 and both[0][4] == pytest.approx((44.0 + 90.52) / 2, abs=0.05)
    assert net.files("all_reduce") == ["cloud.csv", "all_reduce_perf_2n.log"]
    assert net.files("all_to_all") == []
    assert "all_to_all, send_recv from the catalog" in net.describe()


def test_study_reads_the_files_relative_to_itself_and_stores_the_points(tmp_path):
    for name in ("cloud.csv", "all_reduce_perf_4n.log"):
        (tmp_path / "net").mkdir(exist_ok=True)
        (tmp_path / "net" / name).write_text((DATA / name).read_text())
    spec = StudySpec.from_yaml(_study(tmp_path, ["net/cloud.csv", "net/all_reduce_perf_4n.log"]))
    assert spec.cluster.network is not None
    assert [s.path for s in spec.cluster.network.sources] == ["net/cloud.csv", "net/all_reduce_perf_4n.log"]
    # a stored study is read back without the files
    again = StudySpec.from_dict(spec.to_public_dict(), base_dir="/nonexistent")
    assert again.cluster.network == spec.cluster.network
    assert space_hash(again) == space_hash(spec)


def test_space_hash_covers_the_files_content_and_not_an_absent_network(tmp_path):
    plain = StudySpec.from_yaml(STUDY)
    assert "network" not in plain.cluster.model_fields_set
    (tmp_path / "n.csv").write_text((DATA / "cloud.csv").read_text())
    with_net = StudySpec.from_yaml(_study(tmp_path, "n.csv"))
    assert space_hash(with_net) != space_hash(plain)
    (tmp_path / "n.csv").write_text((DATA / "cloud.csv").read_text().replace("11.0", "12.0"))
    changed = StudySpec.from_yaml(_study(tmp_path, "n.csv"))
    assert space_hash(changed) != space_hash(with_net)
    # a study without cluster.network keeps the hash it had before the field existed
    data = plain.to_dict()
    del data["cluster"]["network"]
    assert space_hash(StudySpec.from_dict(data)) == space_hash(plain)


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        (
            "bad.csv",
            "collective,ranks,ranks_per_node,bytes,busbw_gbs\nallreduce,16,8,1024,3.0\n",
            "bad.csv:2",
        ),
        ("bad.csv", "collective,ranks,bytes,busbw_gbs\nall_reduce,16,1024,3.0\n", "missing ranks_per_node"),
        (
            "bad.csv",
            "collective,ranks,ranks_per_node,bytes,busbw_gbs\nall_reduce,16,32,1024,3.0\n",
            "bad.csv:2",
        ),
        ("all_reduce_perf.log", "# nThread 1 nGpus 8\n", "no nccl-tests result rows"),
        ("mystery.log", None, "cannot tell which collective"),
        ("all_reduce_perf.log", "wrong", "#wrong = 3"),
        ("all_reduce_perf.log", "nodevices", "no '#  Rank N"),
    ],
)
def test_bad_network_file_is_one_spec_error_naming_file_line_and_fix(tmp_path, name, text, said):
    log = (DATA / "all_reduce_perf_2n.log").read_text()
    if text is None:  # an old log without the 'starting' line, under a name that names no binary
        text = log.replace("# Collective test starting: all_reduce_perf\n", "")
    elif text == "wrong":
        lines = log.splitlines(keepends=True)
        row = next(i for i, ln in enumerate(lines) if ln.strip().startswith("1048576"))
        lines[row] = lines[row][: lines[row].rindex("0")] + "3\n"
        text = "".join(lines)
    elif text == "nodevices":
        text = "".join(ln for ln in log.splitlines(keepends=True) if "Rank" not in ln)
    (tmp_path / name).write_text(text)
    with pytest.raises(SpecError) as err:
        StudySpec.from_yaml(_study(tmp_path, name))
    msg = str(err.value)
    assert "cluster.network" in msg and said in msg
    assert msg.count("\n") == 0  # one error


def test_missing_file_and_a_scope_wider_than_the_node_are_refused(tmp_path):
    with pytest.raises(SpecError, match=r"cluster\.network: .*cannot read .*nope\.csv"):
        StudySpec.from_yaml(_study(tmp_path, "nope.csv"))
    (tmp_path / "wide.csv").write_text(
        "collective,ranks,ranks_per_node,bytes,busbw_gbs\nall_reduce,32,16,1024,3\n"
    )
    with pytest.raises(SpecError, match="16 ranks per node but cluster.gpus_per_node is 8"):
        StudySpec.from_yaml(_study(tmp_path, "wide.csv"))
