"""The layouts a run could take on `--gpus N --nodes M`, each planned: tensor parallelism within
a node, expert parallelism for an MoE model, HSDP with one replica group per node, or FSDP2 over
every GPU; and the one proposed — the fastest predicted that fits, then the one whose
collectives take least time at the links' rates (within a node and between nodes), then the
least tensor parallelism. The step time is the FLOPs' (a
tensor-parallel rank computes its share); what the collectives cost in time is not in it yet,
only their bytes."""

from dataclasses import dataclass

from tuneforge.config import RunConfig
from tuneforge.data.length_policy import RecordLengths
from tuneforge.hardware.gpus import link_gbps
from tuneforge.mesh_rules import MeshSizes, mesh_problems
from tuneforge.plan.prediction import Hardware, Plan
from tuneforge.plan.traffic import collective_spans

SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Layout:
    tensor: int
    expert: int
    replicate: int
    plan: Plan
    cross_node_gb: float
    """Bytes (GB) one GPU sends per step in collectives whose ranks span nodes."""

    @property
    def overrides(self) -> list[str]:
        return [
            f"parallel.tensor_parallel={self.tensor}",
            f"parallel.expert_parallel={self.expert}",
            f"parallel.data_parallel_replicate={self.replicate}",
        ]

    world: int = 1
    collective_s: float = 0.0
    """The step's collectives at the links' spec rates, were none of them overlapped with
    compute (`hardware.gpus.link_gbps`)."""

    @property
    def seconds_per_token(self) -> float:
        """A step's time over the tokens all data-parallel ranks train in it."""
        tokens = self.plan.tokens_per_step * (self.world // self.tensor)
        return self.plan.step_time_s / max(tokens, 1.0)

    @property
    def collective_s_per_token(self) -> float:
        return self.collective_s / max(self.plan.tokens_per_step * (self.world // self.tensor), 1)

    def describe(self) -> str:
        return self.plan.strategy


def candidate_sizes(config: RunConfig, hardware: Hardware) -> list[tuple[int, int, int]]:
    from tuneforge.plan.planner import run_model_args

    args = run_model_args(config)
    world, per_node = hardware.data_parallel, hardware.gpus
    experts = args.moe.num_experts if args.moe is not None else 1
    found = []
    for tensor in (t for t in SIZES if t <= per_node):
        for expert in (e for e in SIZES if e <= experts):
            for replicate in sorted({1, hardware.nodes}):
                sizes = MeshSizes(world, tensor, expert, replicate)
                if not mesh_problems(sizes, args.split_sizes()):
                    found.append((tensor, expert, replicate))
    return found


def plan_layouts(
    config: RunConfig, hardware: Hardware, records: RecordLengths | None = None
) -> list[Layout]:
    """Every valid layout planned, the proposed one first."""
    from tuneforge.plan.planner import plan_run

    layouts = []
    for tensor, expert, replicate in candidate_sizes(config, hardware):
        parallel = config.parallel.model_copy(
            update={
                "strategy": "fsdp",
                "tensor_parallel": tensor,
                "expert_parallel": expert,
                "data_parallel_replicate": replicate,
            }
        )
        plan = plan_run(config.model_copy(update={"parallel": parallel}), hardware, records)
        spans = collective_spans(tensor, expert, hardware.data_parallel, replicate)
        crossing = sum(
            gb for name, gb in plan.collectives_gb.items() if spans.get(name, 1) > hardware.gpus
        )
        world = hardware.data_parallel
        within, between = link_gbps(hardware.gpu)
        total = plan.collective_gb_per_step
        seconds = crossing / between + (total - crossing) / within
        layouts.append(Layout(tensor, expert, replicate, plan, crossing, world, seconds))
    return sorted(
        layouts,
        key=lambda layout: (
            not layout.plan.fits,
            round(layout.seconds_per_token, 12),
            layout.collective_s_per_token,
            layout.tensor,
        ),
    )
