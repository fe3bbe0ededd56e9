"""The device mesh of a layout (`ParallelDims`): one `DeviceMesh` over every rank, and the
sub-meshes each technique works on, as torchtitan names them. The tensor dimension is
innermost, so a node's GPUs hold one layer between them."""

import warnings
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from tuneforge.parallel_dims import ParallelDims


@dataclass(frozen=True)
class Meshes:
    world: DeviceMesh
    """dp_replicate × efsdp × ep × tp."""
    dense: DeviceMesh
    """What FSDP2 shards the dense parameters over: dp_replicate × dp_shard (HSDP), where
    dp_shard is efsdp × ep flattened."""
    tensor: DeviceMesh
    expert: DeviceMesh
    expert_data: DeviceMesh
    """What FSDP2 shards an expert-parallel rank's experts over: dp_replicate × efsdp, the ranks
    that hold the same experts."""
    data: DeviceMesh
    """Every rank that reads its own data (dp_replicate × dp_shard, flattened): the loss's and
    the token counts' sums run over it."""


def build_meshes(dims: ParallelDims, device: torch.device) -> Meshes:
    shape = (dims.replicate, dims.expert_shards, dims.expert, dims.tensor)
    names = ("dp_replicate", "efsdp", "ep", "tp")
    world = init_device_mesh(device.type, shape, mesh_dim_names=names)
    world["efsdp", "ep"]._flatten("dp_shard")
    data = world["dp_replicate", "efsdp", "ep"]._flatten("dp")  # kept: slicing it would warn
    # one all-reduce, not one per dimension, for a norm or sum over every sharded dimension
    world["efsdp", "ep", "tp"]._flatten("dp_shard_tp")
    with warnings.catch_warnings():
        # torch warns that slicing a flattened dim will go; its successor, `_unflatten`, fails
        # on torch 2.11 (it refuses a dimension's name, and slicing what it returns)
        warnings.filterwarnings("ignore", message="Slicing a flattened dim")
        dense = world["dp_replicate", "dp_shard"]
    return Meshes(
        world=world,
        dense=dense,
        tensor=world["tp"],
        expert=world["ep"],
        expert_data=world["dp_replicate", "efsdp"],
        data=data,
    )
