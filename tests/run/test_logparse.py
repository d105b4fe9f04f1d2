"""Log parsing: Megatron, Primus (new and old), TorchTitan, OOM detection, warm-up dropping."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_optuna.run.logparse import parse_log, tail

DATA = Path(__file__).parent / "data"


def _read(name: str) -> str:
    return (DATA / name).read_text()


def test_megatron_derives_tokens_and_drops_warmup() -> None:
    p = parse_log(_read("megatron.log"), seq_length=8192, world_size=64)
    assert [r.iteration for r in p.records] == [1, 2, 3, 4, 5, 6, 7]
    assert [r.iteration for r in p.steady] == [3, 4, 5, 6, 7]
    # median of 36250.1, 36300, 36200, 52000 (a stall), 36250 -> 36250.1 ms; the stall does not move it
    assert p.step_time_s == pytest.approx(36.2501)
    assert p.tokens_per_s_per_gpu == pytest.approx(8192 * 128 / 36.2501 / 64)
    assert p.tflops_per_gpu == pytest.approx(612.3)
    assert p.peak_memory_gib == pytest.approx(150528.0 / 1024)
    assert not p.oom


def test_megatron_without_seq_has_no_tokens() -> None:
    p = parse_log(_read("megatron.log"))
    assert p.step_time_s == pytest.approx(36.2501)
    assert p.tokens_per_s_per_gpu is None


def test_primus_reads_instantaneous_tokens_and_no_peak_from_hip_memory() -> None:
    p = parse_log(_read("primus.log"), seq_length=8192, world_size=64)
    assert [r.iteration for r in p.steady] == [3, 4, 5]
    assert p.tokens_per_s_per_gpu == pytest.approx(3620.8)
    assert p.step_time_s == pytest.approx(36.2)
    assert p.tflops_per_gpu == pytest.approx(613.2)
    # "hip mem usage" is the printing rank's memory in use, not a peak over ranks
    assert p.peak_memory_gib is None


def test_older_primus_format() -> None:
    p = parse_log(_read("primus_old.log"))
    assert p.tokens_per_s_per_gpu == pytest.approx((9801.4 + 9810.8) / 2)
    assert p.peak_memory_gib is None


def test_primus_peak_is_the_rocm_max_over_ranks_not_the_printing_ranks_hip_usage() -> None:
    """Primus with use_rocm_mem_info prints its all-reduced maximum over ranks and the rank holding it
    (primus/backends/megatron/patches/training_log/print_rank_last_patches.py@fd1eeabb:283-316); the last
    rank's "hip mem usage" (here larger on one line: the pipeline's last stage at that moment) is not it."""
    line = (
        "[rank-63/64][INFO ] iteration {i}/ 10 | elapsed time per iteration (ms): 36000.0/36000.0 | "
        "tokens/s/GPU inst/harmonic mean: 3600.0/3600.0 | hip mem usage/free/total/usage_ratio: "
        "{hip:.2f}GB/40.00GB/288.00GB/80.00% | rocm mem usage/free/total/usage_ratio: 180.00GB/108.00GB/"
        "288.00GB/62.50% | rank-{r} rocm max mem usage/usage_ratio: {mx:.2f}GB/{pct:.2f}%"
    )
    text = "\n".join(
        line.format(i=i, hip=hip, r=r, mx=mx, pct=mx / 288 * 100)
        for i, hip, r, mx in [(1, 150.0, 0, 201.5), (2, 260.0, 8, 230.25), (3, 150.0, 0, 229.0)]
    )
    p = parse_log(text)
    assert p.peak_memory_gib == pytest.approx(230.25)
    assert p.peak_memory_by_rank == {0: pytest.approx(229.0), 8: pytest.approx(230.25)}


def test_megatron_peak_is_read_from_every_ranks_report_memory_line() -> None:
    """Megatron-LM's report_memory is printed by each data-parallel-rank-0 rank
    (megatron/training/utils/common_utils.py@d98e8a64:313-334), here through torchrun's rank prefixes; the
    first pipeline stage (rank 0) holds the most."""
    ranks = {0: 70123.5, 16: 61000.0, 32: 52000.25, 48: 48000.0}
    lines = [
        f"[default{r % 8}]:[Rank {r}] (after 2 iterations) memory (MB) | allocated: 30000.00 | max allocated: "
        f"{mb:.2f} | reserved: 80000.00 | max reserved: 80000.00"
        for r, mb in ranks.items()
    ]
    p = parse_log("\n".join([_read("megatron.log"), *lines]), seq_length=8192, world_size=64)
    assert p.peak_memory_gib == pytest.approx(150528.0 / 1024)  # rank 63's line in megatron.log
    assert p.peak_memory_by_rank == {
        **{r: pytest.approx(mb / 1024) for r, mb in ranks.items()},
        63: pytest.approx(150528.0 / 1024),
    }


def test_torchtitan_format() -> None:
    p = parse_log(_read("torchtitan.log"), seq_length=8192, world_size=8, global_batch_size=8)
    assert [r.iteration for r in p.steady] == [3, 4, 5]
    assert p.tokens_per_s_per_gpu == pytest.approx(8123)
    assert p.peak_memory_gib == pytest.approx(45.25)
    assert p.step_time_s == pytest.approx(8192 * 8 / 8123 / 8)


@pytest.mark.parametrize(
    "line",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
        "RuntimeError: HIP out of memory. Tried to allocate 2 GiB",
        "RuntimeError: [enforce fail] out of memory",
        "NCCL WARN Cuda failure 'out of memory'",
        "RCCL error: ncclSystemError: failed to alloc buffer",
    ],
)
def test_oom_patterns(line: str) -> None:
    assert parse_log(f"starting\n{line}\n").oom


def test_oom_log_and_short_logs() -> None:
    p = parse_log(_read("oom.log"))
    assert p.oom and "HIP out of memory" in (p.oom_line or "")
    # a single logged iteration is still used (nothing else is there)
    assert [r.iteration for r in p.steady] == [1]
    assert not parse_log("hello\nworld\n").oom
    assert parse_log("").tokens_per_s_per_gpu is None


def test_ansi_and_duplicate_ranks() -> None:
    line = "\x1b[32m iteration 3/ 9 | elapsed time per iteration (ms): 100.0 | tokens per GPU (tokens/s/GPU): 50.0 |\x1b[0m"
    p = parse_log("\n".join([line.replace("3/", "1/"), line.replace("3/", "2/"), line, line]))
    assert len(p.records) == 3 and p.tokens_per_s_per_gpu == pytest.approx(50.0)


def test_tail() -> None:
    text = "\n".join(str(i) for i in range(100))
    assert tail(text, lines=3) == "97\n98\n99"


def test_reserved_peak_is_read_beside_the_allocated_one() -> None:
    """Megatron's report_memory prints ``max reserved`` after ``max allocated`` (common_utils.py@d98e8a64
    :322-325); TorchTitan's ``memory:`` is its reserved peak (metrics.py@b5bcd76c:68-70, 531); a log without
    either has none."""
    mega = parse_log(_read("megatron.log"), seq_length=8192, world_size=64)
    assert mega.peak_memory_gib == pytest.approx(150528.0 / 1024)
    assert mega.peak_reserved_gib == pytest.approx(160000.0 / 1024)
    assert mega.to_dict()["peak_reserved_gib"] == pytest.approx(160000.0 / 1024)
    titan = parse_log(_read("torchtitan.log"), seq_length=8192, world_size=8, global_batch_size=8)
    assert titan.peak_reserved_gib == pytest.approx(45.25)
    assert parse_log(_read("primus.log")).peak_reserved_gib is None
