"""FSDP2 memory (``dp_shard`` in :mod:`primus_optuna.physics.memory`) checked against torch's own
``fully_shard`` on a gloo process group of 2 and 4 CPU processes, as the Megatron-Core saved-tensor check
does for activations (tests/mcore/test_megatron_saved_tensors.py).

A small Llama-like model is built from the study's own shapes (hidden, layers, heads, KV groups, FFN, vocab;
its per-module parameter counts are asserted equal to the physics'), wrapped as TorchTitan wraps it (the
embedding, each layer, and the final norm with the output layer as FSDP units, then the root;
torchtitan/distributed/fsdp.py@b5bcd76c:245-266) with TorchTitan's mixed precision (bf16 parameters, fp32
reduction) and trained with Adam. Bytes held per rank are read by torch's ``FSDPMemTracker``
(torch/distributed/_tools/fsdp2_mem_tracker.py), which files every tensor as sharded/unsharded parameter,
gradient, all-gather or reduce-scatter buffer, optimizer state or activation, at every FSDP module's pre/post
forward and backward.

Per term (bytes per rank; tolerance = FSDP2's dim-0 padding to a multiple of the group, < 2% here):

- sharded gradients: ``grad_bytes`` (fp32) × parameters / dp_shard;
- fp32 master weights + Adam moments: the physics' 12 bytes per sharded parameter; under FSDP2 the fp32
  sharded parameter *is* the master (it is what Adam updates), so it is compared with sharded parameter +
  optimizer state (less Adam's 4-byte ``step`` per tensor);
- the 16-bit sharded weights the physics also counts (2 bytes per sharded parameter: Megatron's paths keep
  bf16 sharded parameters next to the fp32 master) are the one stated difference: FSDP2 with a
  ``MixedPrecisionPolicy`` casts at the all-gather and keeps no 16-bit shard
  (torch/distributed/fsdp/_fully_shard/_fsdp_param.py@2.13.0:896-901), so the physics' sharded total is
  measured + exactly that copy (18 against 16 bytes per sharded parameter);
- unsharded working set without pipeline parallelism: at its largest (backward, before a layer's
  reduce-scatter) the layer computing and the one prefetched in bf16, that layer's bf16 gradients and the
  previous layer's fp32 reduce-scatter input: the physics' 2·2 + (2 + 4) bytes per unit;
- with pipeline parallelism (torch's pipeline stage on every micro-batch but the last:
  ``set_reshard_after_backward(False)``, ``set_requires_gradient_sync(False)``,
  torch/distributed/pipelining/stage.py@2.13.0:844-847; TorchTitan's ``reshard_after_forward`` is off with
  PP): the whole stage stays gathered in bf16 and its gradients accumulate unsharded in fp32 (the tracker
  files these as ``Temp``: they are FSDP's ``unsharded_accumulated_grad``, not ``.grad``), the physics' pp > 1
  terms for the stage holding these layers and the output layer;
- HSDP (4 ranks as 2 replicas × 2 shards): sharded over dp_shard = 2, not over dp = 4.

Every compared term agrees to the byte at these shapes (scripts/check_fsdp_memory.py prints them). Activations
do not change with dp_shard (same local batch: equal bytes on 2 and 4 ranks); their per-tensor
account is the Megatron-Core check's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from primus_optuna.physics.layer_mix import rank_layer_params
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.shapes import embedding_params, output_params
from primus_optuna.space import TrainingConfig
from primus_optuna.spec import GIB, StudySpec

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
mp = pytest.importorskip("torch.multiprocessing")
if "fork" not in mp.get_all_start_methods():
    pytest.skip(
        "needs the fork start method (spawned ranks re-import torch: too slow)", allow_module_level=True
    )

MODEL: dict[str, Any] = {
    "name": "tiny-llama",
    "num_layers": 3,
    "hidden_size": 64,
    "ffn_hidden_size": 160,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "vocab_size": 640,  # the embedding about one layer's size, as in Llama 3.1 70B
    "swiglu": True,
    "normalization": "RMSNorm",
    "position_embedding_type": "rope",
    "untie_embeddings_and_output_weights": True,
}
SEQ, MBS = 32, 2
WORLDS = (2, 4)
PADDING = 0.02
"""FSDP2 pads each parameter's dim 0 to a multiple of the group (torch ``_fsdp_param.py``)"""
ADAM_STEP_BYTES = 4
"""torch Adam's per-tensor ``step`` (an fp32 scalar tensor on CPU)"""


def study(world: int, layers: int = MODEL["num_layers"], pp: int = 1) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "fsdp-check",
            "model": {**MODEL, "num_layers": layers},
            "cluster": {"gpu": "h100", "nodes": 1, "gpus_per_node": world},
            "workload": {"seq_length": SEQ, "global_batch_size": MBS * world // pp, "precision": "bf16"},
        }
    )


def physics(spec: StudySpec, stage: int, **axes: Any) -> dict[str, float]:
    """The stage's breakdown in bytes, and its parameters."""
    c = TrainingConfig(**axes).derive(spec.world, spec.workload.global_batch_size)
    st = estimate_memory(spec, c).stages[stage]
    return {k.removesuffix("_gib"): v * GIB for k, v in st.breakdown.items()} | {"params": st.params}


# --- the torch side (runs in the forked ranks) --------------------------------------------------------------
def _model(embedding: bool) -> Any:
    nn, F = torch.nn, torch.nn.functional
    h, a, g, f, v = (MODEL[k] for k in ("hidden_size", "num_attention_heads", "num_query_groups",
                                         "ffn_hidden_size", "vocab_size"))  # fmt: skip
    d = h // a

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(h), nn.RMSNorm(h)
            self.qkv = nn.Linear(h, (a + 2 * g) * d, bias=False)
            self.proj = nn.Linear(a * d, h, bias=False)
            self.fc1 = nn.Linear(h, 2 * f, bias=False)
            self.fc2 = nn.Linear(f, h, bias=False)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, val = self.qkv(self.n1(x)).split([a * d, g * d, g * d], -1)
            q = q.view(b, t, a, d).transpose(1, 2)
            k = k.view(b, t, g, d).transpose(1, 2).repeat_interleave(a // g, 1)
            val = val.view(b, t, g, d).transpose(1, 2).repeat_interleave(a // g, 1)
            o = F.scaled_dot_product_attention(q, k, val, is_causal=True).transpose(1, 2).reshape(b, t, h)
            x = x + self.proj(o)
            up, gate = self.fc1(self.n2(x)).chunk(2, -1)
            return x + self.fc2(F.silu(up) * gate)

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(v, h) if embedding else None
            self.layers = nn.ModuleList(Block() for _ in range(MODEL["num_layers"]))
            self.norm, self.out = nn.RMSNorm(h), nn.Linear(h, v, bias=False)

        def forward(self, x: Any) -> Any:
            x = self.emb(x) if self.emb is not None else x
            for layer in self.layers:
                x = layer(x)
            return self.out(self.norm(x))

    return GPT()


def _categories(snapshot: dict) -> dict[str, int]:
    return {getattr(k, "value", k): int(v) for dev in snapshot.values() for k, v in dev.items()}


def _run(mode: str, world: int) -> dict[str, Any]:
    """One mode on this rank: ``fsdp`` (pp = 1), ``pipeline`` (a stage without the embedding, one
    micro-batch as torch's pipeline stage runs it), ``hsdp`` (2 replicas × world/2 shards)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = _model(embedding=mode != "pipeline")
    shape = (2, world // 2) if mode == "hsdp" else (world,)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp_replicate", "dp_shard")[-len(shape) :])
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    raf = mode != "pipeline"  # TorchTitan: reshard_after_forward = not pp_enabled; never for norm + output
    kw = {"mesh": mesh, "mp_policy": mp_policy}
    if model.emb is not None:
        fully_shard(model.emb, reshard_after_forward=raf, **kw)
    fully_shard([model.norm, model.out], reshard_after_forward=False, **kw)
    for layer in model.layers:
        fully_shard(layer, reshard_after_forward=raf, **kw)
    fully_shard(model, reshard_after_forward=raf, **kw)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    v, h = MODEL["vocab_size"], MODEL["hidden_size"]
    ids = torch.randint(0, v, (MBS, SEQ))
    inp = ids if model.emb is not None else torch.randn(MBS, SEQ, h)

    def loss() -> Any:
        return torch.nn.functional.cross_entropy(model(inp).float().flatten(0, 1), ids.flatten())

    loss().backward()  # a first step allocates Adam's state
    opt.step()
    opt.zero_grad()
    tracker = FSDPMemTracker(model, opt)
    tracker.track_inputs((inp,))
    out: dict[str, Any] = {"tensors": sum(1 for _ in model.parameters())}
    with tracker:
        if mode == "pipeline":  # a micro-batch but the last (torch/distributed/pipelining/stage.py:844-847)
            model.set_is_last_backward(False)
            model.set_reshard_after_backward(False)
            model.set_requires_gradient_sync(False)
            loss().backward()
            out["held"] = _categories(tracker.get_tracker_snapshot("current"))
            model.set_is_last_backward(True)
            model.set_reshard_after_backward(True)
            model.set_requires_gradient_sync(True)
        value = loss()
        out["forward"] = _categories(tracker.get_tracker_snapshot("current"))
        value.backward()
        out["backward"] = _categories(tracker.get_tracker_snapshot("current"))
        opt.step()
        opt.zero_grad()
    best: dict[str, int] = {}
    for stats in tracker.memory_tracking.values():  # the largest unsharded working set at any module state
        for snaps in stats.snapshots.values():
            for snap in snaps:
                c = _categories(snap)
                c["params_in_flight"] = c["Unsharded Param"] + c["All Gather"]
                c["grads_in_flight"] = c["Unsharded Grad"] + c["Reduce Scatter"]
                if c["params_in_flight"] + c["grads_in_flight"] > best.get("working", -1):
                    best = c | {"working": c["params_in_flight"] + c["grads_in_flight"]}
    out["working_set"] = best
    return out


def _rank(rank: int, world: int, store: str, results: str, modes: tuple[str, ...]) -> None:
    torch.set_num_threads(1)  # a forked child must not enter the parent's OpenMP pool
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the ranks talk over loopback
    if dist.is_initialized():  # a group the parent process holds (forked with it): not this one's
        dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        got = {mode: _run(mode, world) for mode in modes}
        Path(results, f"{rank}.json").write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()


def measure(root: Path) -> dict[int, list[dict[str, Any]]]:
    """{world: per rank {mode: measurements}}: 2 ranks run fsdp and pipeline, 4 ranks fsdp and hsdp (files
    under ``root``)."""
    out = {}
    for world, modes in ((2, ("fsdp", "pipeline")), (4, ("fsdp", "hsdp"))):
        d = root / f"fsdp{world}"
        d.mkdir()
        mp.start_processes(
            _rank, args=(world, str(d / "store"), str(d), modes), nprocs=world, start_method="fork"
        )
        out[world] = [json.loads((d / f"{r}.json").read_text()) for r in range(world)]
    return out


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    return measure(tmp_path_factory.mktemp("fsdp"))


# --- the checks ---------------------------------------------------------------------------------------------
def test_the_torch_model_has_the_physics_parameters() -> None:
    spec = study(2)
    m = spec.model
    assert (
        sum(p.numel() for p in _model(True).layers[0].parameters()) == rank_layer_params(m, 1, 1, False).total
    )
    model = _model(True)
    assert model.emb.weight.numel() == embedding_params(spec, 1)
    assert sum(p.numel() for p in (*model.norm.parameters(), *model.out.parameters())) == output_params(
        spec, 1, 1
    )
    assert sum(p.numel() for p in model.parameters()) == physics(spec, 0, dp_shard=2)["params"]


@pytest.mark.parametrize("world", WORLDS)
def test_sharded_state_per_rank_matches_the_physics(measured, world: int) -> None:
    phys = physics(study(world), 0, dp_shard=world)
    share = phys["params"] / world
    for got in measured[world]:
        after = got["fsdp"]["backward"]
        master_and_moments = (
            after["Sharded Param"] + after["OptState"] - ADAM_STEP_BYTES * got["fsdp"]["tensors"]
        )
        assert after["Sharded Grad"] == pytest.approx(4 * share, rel=PADDING)
        assert master_and_moments == pytest.approx(phys["optimizer"], rel=PADDING)
        # the physics' sharded total = torch's + the 16-bit shard Megatron keeps and FSDP2 does not
        phys_sharded = 2 * share + 4 * share + phys["optimizer"]
        torch_sharded = after["Sharded Param"] + after["Sharded Grad"] + after["OptState"]
        torch_sharded -= ADAM_STEP_BYTES * got["fsdp"]["tensors"]
        assert phys_sharded - torch_sharded == pytest.approx(2 * share, rel=0.2)
        assert phys_sharded / torch_sharded == pytest.approx(18 / 16, rel=PADDING)


@pytest.mark.parametrize("world", WORLDS)
def test_unsharded_working_set_is_two_units_and_one_units_gradients(measured, world: int) -> None:
    phys = physics(study(world), 0, dp_shard=world)
    share = phys["params"] / world
    params_in_flight = phys["weights"] - 2 * share  # 2 units × 2 bytes
    grads_in_flight = phys["gradients"] - 4 * share  # one unit × (2 + 4) bytes
    for got in measured[world]:
        ws = got["fsdp"]["working_set"]
        assert ws["params_in_flight"] == pytest.approx(params_in_flight, rel=PADDING)
        assert ws["grads_in_flight"] == pytest.approx(grads_in_flight, rel=PADDING)


def test_pipeline_stage_stays_gathered_with_fp32_unsharded_gradients(measured) -> None:
    """The torch model is stage 1 of 2 of a model twice as deep: its layers, the final norm and the output
    layer."""
    layers = 2 * MODEL["num_layers"]
    phys = physics(study(4, layers, pp=2), 1, dp_shard=2, pp=2)  # 2 replicas of a 2-stage pipeline
    unit = max(rank_layer_params(study(2).model, 1, 1, False).total, output_params(study(2), 1, 2))
    share = phys["params"] / 2
    for got in measured[2]:
        held = got["pipeline"]["held"]
        assert held["Unsharded Param"] == pytest.approx(phys["weights"] - 2 * share, rel=PADDING)
        accumulated = held["Temp"] + held["Unsharded Grad"]
        assert accumulated == pytest.approx(phys["gradients"] - 4 * share - 2 * unit, rel=PADDING)


def test_hsdp_shards_over_dp_shard_and_replicates_over_the_rest(measured) -> None:
    phys = physics(study(4), 0, dp_shard=2)
    for got in measured[4]:
        after = got["hsdp"]["backward"]
        assert after["Sharded Param"] == pytest.approx(4 * phys["params"] / 2, rel=PADDING)
        master_and_moments = (
            after["Sharded Param"] + after["OptState"] - ADAM_STEP_BYTES * got["hsdp"]["tensors"]
        )
        assert master_and_moments == pytest.approx(phys["optimizer"], rel=PADDING)


def test_activations_do_not_change_with_dp_shard(measured) -> None:
    acts = {got["fsdp"]["forward"]["Activation"] for world in WORLDS for got in measured[world]}
    assert len(acts) == 1 and acts.pop() > 0
    spec2, spec4 = study(2), study(4)
    assert physics(spec2, 0, dp_shard=2)["activations"] == physics(spec4, 0, dp_shard=4)["activations"]
