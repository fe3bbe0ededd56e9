"""Which mesh sizes a run can take: the tensor-parallel size must divide the ranks, the attention
heads, the KV heads and the MLP width (each rank holds whole heads and a slice of the MLP); the
expert-parallel size must divide the experts and the ranks that read different data within a
replica group; the replica groups must divide the data-parallel ranks. Each refusal names the
rule and the nearest sizes that keep it (the trainer and the planner both ask here)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class SplitSizes:
    """What the mesh sizes split of one model."""

    heads: int
    kv_heads: int
    ffn_dim: int
    """The dense MLP's width (column-parallel gate and up, row-parallel down)."""
    experts: int = 0
    """Routed experts per MoE layer (0: a dense model)."""
    latent_attention: bool = False


@dataclass(frozen=True)
class MeshSizes:
    world_size: int
    tensor: int = 1
    expert: int = 1
    replicate: int = 1


def _rank_rules(sizes: MeshSizes) -> list[str]:
    if sizes.world_size % (sizes.tensor * sizes.replicate):
        return [f"must divide the {sizes.world_size} ranks"]
    return []


def _tensor_rules(sizes: MeshSizes, split: SplitSizes | None) -> list[str]:
    if split is None or sizes.tensor == 1:
        return []
    if split.latent_attention:
        return ["is not built for latent attention (DeepSeek-V2)"]
    return [
        f"must divide the {count} {what}"
        for count, what in (
            (split.heads, "attention heads"),
            (split.kv_heads, "KV heads"),
            (split.ffn_dim, "MLP width"),
        )
        if count % sizes.tensor
    ]


def _expert_rules(sizes: MeshSizes, split: SplitSizes | None) -> list[str]:
    if sizes.expert == 1:
        return []
    if split is not None and split.experts == 0:
        return ["needs a mixture-of-experts model (this one is dense)"]
    rules = []
    if split is not None and split.experts % sizes.expert:
        rules.append(f"must divide the {split.experts} experts")
    group = sizes.tensor * sizes.replicate
    if sizes.world_size % group == 0 and (sizes.world_size // group) % sizes.expert:
        rules.append(
            f"must divide the {sizes.world_size // group} data-parallel ranks of a replica group "
            f"({sizes.world_size} ranks / tensor_parallel {sizes.tensor} / "
            f"data_parallel_replicate {sizes.replicate})"
        )
    return rules


def _broken(sizes: MeshSizes, split: SplitSizes | None) -> bool:
    return bool(_rank_rules(sizes) or _tensor_rules(sizes, split) or _expert_rules(sizes, split))


def _nearest(sizes: MeshSizes, split: SplitSizes | None, field: str) -> str:
    asked = getattr(sizes, field)
    valid = [
        value
        for value in range(1, sizes.world_size + 1)
        if not _broken(MeshSizes(**{**sizes.__dict__, field: value}), split)
    ]
    nearest = [v for v in valid if v < asked][-1:] + [v for v in valid if v > asked][:1]
    if not nearest:
        return "none with the other sizes as they are"
    return " or ".join(str(value) for value in nearest)


MESH_FIX = "choose a size the rule names as valid"

KEYS = {
    "tensor": "tensor_parallel",
    "expert": "expert_parallel",
    "replicate": "data_parallel_replicate",
}


def mesh_problems(sizes: MeshSizes, split: SplitSizes | None = None) -> list[str]:
    """Every broken rule, as `parallel.KEY=N RULE (nearest valid KEY: a or b)`; none when the
    layout works. Without `split` only the rank counts are checked."""
    return [f"{key}={problem}" for key, problem in mesh_problems_by_key(sizes, split)]


def mesh_problems_by_key(
    sizes: MeshSizes, split: SplitSizes | None = None
) -> list[tuple[str, str]]:
    """`mesh_problems`, each as the key it is about (`parallel.tensor_parallel`) and the rest
    of its text (`4 must divide the 6 attention heads (nearest valid: 3 or 6)`)."""
    problems = []
    for rule in _rank_rules(sizes):
        options = "; ".join(
            f"nearest valid {KEYS[field]}: {_nearest(sizes, split, field)}"
            for field in ("tensor", "replicate")
        )
        problems.append(
            (
                f"parallel.{KEYS['tensor']}",
                f"{sizes.tensor} × parallel.data_parallel_replicate={sizes.replicate} {rule} "
                f"({options})",
            )
        )
    for field, rules in (
        ("tensor", _tensor_rules(sizes, split)),
        ("expert", _expert_rules(sizes, split)),
    ):
        for rule in rules:
            problems.append(
                (
                    f"parallel.{KEYS[field]}",
                    f"{getattr(sizes, field)} {rule} "
                    f"(nearest valid: {_nearest(sizes, split, field)})",
                )
            )
    return problems
