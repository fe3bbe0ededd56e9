"""Under torchrun: the gradients of one forward and backward of a tiny model under a device-mesh
layout (`tensor expert replicate` sizes), each rank on its own batch, against one process's over
all the batches. Prints the worst relative difference of any trainable parameter's gradient."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script under torchrun
    sys.path.insert(0, str(REPO))

from tests.helpers import random_packed_batch, randomise_adapters  # noqa: E402
from tuneforge.config.sections.parallel import ParallelSection  # noqa: E402
from tuneforge.models.api import load_model  # noqa: E402
from tuneforge.parallel.distributed import Dist, parallelize  # noqa: E402
from tuneforge.parallel.mesh import build_meshes  # noqa: E402
from tuneforge.parallel_dims import ParallelDims  # noqa: E402
from tuneforge.peft.apply import apply_lora  # noqa: E402

LORA = {"enabled": True, "rank": 4, "alpha": 8}
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERTS = ["experts.gate_up_proj", "experts.down_proj"]


def loss_of(model, batch) -> torch.Tensor:
    logits = model.lm_head(model.hidden_states(batch.tokens, batch.packed)).float()
    loss = F.cross_entropy(logits, batch.labels, ignore_index=-100, reduction="sum")
    aux = model.aux_loss()
    return loss if aux is None else loss + 0.01 * aux


class Loss(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch) -> torch.Tensor:
        return loss_of(self.model, batch)


def built(path: str, lora: bool):
    model = load_model(path, dtype="float32", attention="sdpa")
    if lora:
        targets = [*ATTENTION, *EXPERTS] if model.args.moe is not None else ATTENTION
        apply_lora(model, LORA | {"target_modules": targets}, torch.Generator().manual_seed(0))
        randomise_adapters(model)
    return model


def main(path: str, lora: bool, tensor: int, expert: int, replicate: int) -> float:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dims = ParallelDims("shard", world, tensor, expert, replicate)
    batches = [random_packed_batch(384, 64, False, seed) for seed in range(dims.data_parallel_size)]
    reference = built(path, lora)
    (sum(loss_of(reference, batch) for batch in batches) / len(batches)).backward()
    model = built(path, lora)
    meshes = build_meshes(dims, torch.device("cpu"))
    section = ParallelSection(strategy="fsdp")
    wrapped = parallelize(
        Loss(model), model.layers, dims, section, Dist(rank, world), False, meshes
    )
    wrapped(batches[dims.data_rank(rank)]).backward()
    worst = 0.0
    expected = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
        want = expected[name].grad
        assert want is not None and grad is not None, name
        worst = max(worst, ((grad - want).abs().max() / want.abs().max().clamp(min=1e-12)).item())
    dist.destroy_process_group()
    return worst


if __name__ == "__main__":
    path, mode, *sizes = sys.argv[1:]
    worst = main(path, mode == "lora", *map(int, sizes))
    if int(__import__("os").environ.get("RANK", "0")) == 0:
        print(f"worst relative gradient difference: {worst:.3e}")
    from tuneforge.parallel.distributed import exit_rank

    exit_rank(0)  # as `tuneforge train` ends a rank: DTensor's caches keep the group to teardown
