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


def test_primus_reads_instantaneous_tokens_and_hip_memory() -> None:
    p = parse_log(_read("primus.log"), seq_length=8192, world_size=64)
    assert [r.iteration for r in p.steady] == [3, 4, 5]
    assert p.tokens_per_s_per_gpu == pytest.approx(3620.8)
    assert p.step_time_s == pytest.approx(36.2)
    assert p.tflops_per_gpu == pytest.approx(613.2)
    assert p.peak_memory_gib == pytest.approx(241.0)


def test_older_primus_format() -> None:
    p = parse_log(_read("primus_old.log"))
    assert p.tokens_per_s_per_gpu == pytest.approx((9801.4 + 9810.8) / 2)
    assert p.peak_memory_gib == pytest.approx(153.81)


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
