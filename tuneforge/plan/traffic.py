"""Bytes each GPU sends per optimizer step, by collective. A ring collective over n ranks sends
(n - 1) / n of its buffer from each rank per phase: DDP's all-reduce is two phases over the
trainable gradients; FSDP2 gathers every weight, frozen ones included (once a step under ZeRO-2,
which keeps them between micro-batches; for forward and again for backward of every
micro-batch under ZeRO-3), and reduce-scatters the gradients; HSDP's replica groups all-reduce
their gradient shards. On a mesh each parameter group moves over its own ranks
(`Setup.shares`); tensor parallelism all-reduces a block's activations twice in forward and
their gradients twice in backward (attention and a dense MLP), expert parallelism sends each
routed token's rows to their experts and back, in forward and in backward."""

from tuneforge.models.cost import lora_params
from tuneforge.plan.memory import Setup


def _ring(ranks: int) -> float:
    return (ranks - 1) / ranks if ranks > 1 else 0.0


def collective_bytes(setup: Setup, reduce_bytes: int) -> dict[str, float]:
    """`reduce_bytes`: bytes per element of FSDP2's gradient reduction (4 for fp32). Each
    collective a step runs, with the bytes one GPU sends in it."""
    args = setup.args
    lora = setup.lora is not None
    if not setup.on_mesh:
        return _data_parallel_bytes(setup, reduce_bytes)
    shares = setup.shares()
    gathers = 1 if setup.zero_stage <= 2 else 2 * setup.grad_accum_steps
    b = setup.param_bytes
    out: dict[str, float] = {}
    gathered = _ring(shares.dense_shards) * shares.dense + _ring(shares.routed_shards) * (
        shares.routed
    )
    out["fsdp all-gather"] = gathers * gathered * b
    if lora:  # the adapters' gradients (counted whole: an upper bound)
        trainable = lora_params(args, setup.lora) if setup.lora is not None else 0
        out["fsdp reduce-scatter"] = _ring(shares.dense_shards) * trainable * 4
        replica_grads = trainable * 4 / shares.dense_shards
    else:
        out["fsdp reduce-scatter"] = gathered * reduce_bytes
        replica_grads = shares.sharded() * reduce_bytes
    if setup.replicate > 1:
        out["hsdp all-reduce"] = 2 * _ring(setup.replicate) * replica_grads
    tokens = setup.tokens_per_micro_batch * setup.grad_accum_steps
    sparse = sum(1 for layer in range(args.num_layers) if args.is_sparse_layer(layer))
    if setup.tensor > 1:
        reductions = 2 * args.num_layers + 2 * (args.num_layers - sparse)  # forward and back
        out["tp all-reduce"] = 2 * _ring(setup.tensor) * reductions * tokens * args.dim * b
    if setup.expert > 1 and args.moe is not None:
        rows = tokens * args.moe.top_k * args.dim * b
        out["ep all-to-all"] = 4 * _ring(setup.expert) * sparse * rows
    return {name: value for name, value in out.items() if value > 0}


def _data_parallel_bytes(setup: Setup, reduce_bytes: int) -> dict[str, float]:
    n = setup.data_parallel
    if n == 1:
        return {}
    share = _ring(n)
    args = setup.args
    if setup.lora is not None:
        trainable, grad_bytes = lora_params(args, setup.lora), 4  # fp32 adapters
    else:
        trainable, grad_bytes = args.num_params(), setup.param_bytes
    if setup.zero_stage == 0:
        return {"ddp all-reduce": 2 * share * trainable * grad_bytes}
    gathers = 1 if setup.zero_stage <= 2 else 2 * setup.grad_accum_steps
    weights = args.num_params() * setup.param_bytes
    return {
        "fsdp all-gather": share * gathers * weights,
        "fsdp reduce-scatter": share * trainable * reduce_bytes,
    }


def step_traffic_bytes(setup: Setup, reduce_bytes: int) -> float:
    """All of a step's collectives' bytes from one GPU."""
    return sum(collective_bytes(setup, reduce_bytes).values())


def collective_spans(tensor: int, expert: int, world: int, replicate: int) -> dict[str, int]:
    """Consecutive ranks each collective's group spans (the tensor dimension innermost): a
    group wider than a node's GPUs crosses nodes."""
    shard = world // tensor // replicate
    return {
        "tp all-reduce": tensor,
        "ep all-to-all": tensor * expert,
        "fsdp all-gather": tensor * shard,
        "fsdp reduce-scatter": tensor * shard,
        "hsdp all-reduce": world,
        "ddp all-reduce": world,
    }
