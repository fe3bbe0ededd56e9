"""The mesh the `parallel:` section asks for, against the model's config.json (heads, KV heads,
MLP width, experts) and, where the processes are known, against their number."""

import os

from tuneforge.config.errors import ConfigIssue
from tuneforge.mesh_rules import MESH_FIX, MeshSizes, mesh_problems_by_key
from tuneforge.train.preflight.check import Inputs


def world_size_of(inputs: Inputs) -> int | None:
    """The processes of the run: torchrun's, the plan's GPUs, or `WORLD_SIZE` where it is set;
    None if unknown."""
    if inputs.world is not None:
        return inputs.world.world_size
    if inputs.world_size is not None:
        return inputs.world_size
    size = os.environ.get("WORLD_SIZE")
    return int(size) if size and size.isdigit() else None


def mesh_issues(inputs: Inputs) -> list[ConfigIssue]:
    parallel = inputs.config.parallel
    world = world_size_of(inputs)
    issues = []
    if parallel.strategy == "single" and world is not None and world > 1:
        issues.append(
            ConfigIssue(
                "parallel.strategy",
                f"parallel.strategy=single with {world} processes",
                "use ddp or fsdp (or auto)",
            )
        )
    asked = (parallel.tensor_parallel, parallel.expert_parallel, parallel.data_parallel_replicate)
    if asked == (1, 1, 1):
        return issues
    tensor, expert, replicate = asked
    # unknown processes: the fewest the mesh takes, so that only the model's rules speak
    ranks = world if world is not None else tensor * expert * replicate
    sizes = MeshSizes(ranks, tensor, expert, replicate)
    for field, problem in mesh_problems_by_key(sizes, inputs.model_args.split_sizes()):
        issues.append(ConfigIssue(field, problem, MESH_FIX))
    return issues
