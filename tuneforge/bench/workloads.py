"""The benchmark's workloads: a model shape, what trains, and the tokens of one step."""

from dataclasses import dataclass, field

from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.errors import TuneforgeError

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
EXPERT_BANKS = ("experts.gate_up_proj", "experts.down_proj")
LATENT_ATTENTION = ("q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
"""DeepSeek-V2-Lite's attention projections."""


@dataclass(frozen=True)
class Workload:
    name: str
    shape: str
    """A catalog shape (`tuneforge models`), built with random weights."""
    targets: tuple[str, ...] | None
    """LoRA targets (rank 16, alpha 32), or None for full fine-tuning."""
    layers: int | None = None
    tokens: int = 4096
    memory_cap_gib: float | None = None
    """Runs above it are reported as over the cap."""
    gpus: int = 1
    quantize: str | None = None
    """QLoRA: the frozen base in 4 bits (`model.quantize`) for every system; the peers load it
    through bitsandbytes (Unsloth's `load_in_4bit`, transformers' `BitsAndBytesConfig`)."""
    dora: bool = False
    """DoRA adapters (`lora.use_dora`; PEFT's `use_dora`) for every system (not Unsloth)."""
    objective: str = "sft"
    """`sft`, or `dpo`: each step one preference pair of `tokens` (`batches.synthetic_pair`),
    the reference being the base with its adapters off; its peer is TRL's DPOTrainer; or
    `grpo`: each step `prompts` prompts of `tokens` tokens (`batches.synthetic_prompts`), each
    answered `generations` times with exactly `completion_tokens` tokens (no stop token ends one
    early, for any system), rewarded by `bench/grpo_reward.py`; its peer is TRL's GRPOTrainer."""
    prompts: int = 4
    generations: int = 8
    completion_tokens: int = 256
    peer_checkpointing: tuple[bool, ...] = (False, True)
    """Peer runs: without and with their gradient checkpointing."""
    variants: tuple[str, ...] = field(default=("eager", "compiled"))
    """tuneforge runs: `eager` or `compiled` (torch.compile per block), then options joined by
    `+`: `full` or `selective` activation checkpointing, `offload` (their inputs in host
    memory), `hostN` (N blocks' activations in host memory instead), `keepN` (the last N
    checkpointed blocks keep theirs on the GPU), `hostembed` (the frozen input embedding in host
    memory), `budget0.8` (the compiled graph keeps that share of its activations), `chunk512`
    (tokens per chunk of the loss), `zero2` and `bf16reduce` (FSDP2: parameters kept gathered
    after forward, gradients reduced in bf16), `ddp` (DDP instead of FSDP2 on several GPUs:
    parameters replicated), `ncclN` (at most N NCCL channels per collective), `flash4`,
    `varlen`, `sdpa` or `cudnn` (the attention backend; default: what `auto` picks), `onedoc` (one
    4096-token document, as the peers see it, instead of packed documents), `fp32lora` (adapter
    matmuls in fp32), `graph` (the whole step captured as one CUDA graph, `train.cuda_graph`),
    `accumN` (N micro-batches of `tokens` per optimizer step on each GPU, gradients reduced once),
    `tokensN` (N tokens per micro-batch instead of the workload's),
    `samedata` (every GPU trains on the same batches: a multi-GPU run without the ranks' uneven
    attention work), `balanced` (the ranks' batches dealt as `data.balance_ranks` deals them),
    `fp8` / `fp8hybrid` (the frozen linears in FP8, `precision.fp8: e4m3 | hybrid`), `tensorwise`
    (`precision.fp8_scaling`), `fp8base` (`precision.fp8_base_weights`), `fp4` and `fp4param`
    (emulated NVFP4, `precision.fp4`, `precision.fp4_param`), `nomaster` / `compensated` (a full
    fine-tune without fp32 master weights, or with a bf16 remainder: `precision.master_weights`).
    A multi-GPU workload also runs each variant's per-GPU work on one GPU
    (`baseline_variant`, suffixed `+1gpu`): its scaling efficiency."""


WORKLOADS = {
    w.name: w
    for w in (
        Workload(
            "llama3-8b-lora",
            "llama-3-8b",
            ALL_LINEAR,
            peer_checkpointing=(False,),
            variants=(
                "compiled",
                "compiled+budget0.8+chunk2048",
                "compiled+onedoc",
                "compiled+budget0.8+chunk2048+onedoc+fp8+fp8base",
            ),
        ),
        Workload(
            "llama3-8b-lora-dpo",
            "llama-3-8b",
            ALL_LINEAR,
            objective="dpo",
            variants=("compiled", "compiled+budget0.8+chunk2048"),
        ),
        Workload(
            "llama3-8b-lora-grpo",
            "llama-3-8b",
            ALL_LINEAR,
            tokens=128,
            objective="grpo",
            variants=("eager", "compiled"),
        ),
        Workload(
            "llama3-8b-qlora",
            "llama-3-8b",
            ALL_LINEAR,
            quantize="nf4",
            peer_checkpointing=(True,),
            variants=(
                "compiled+full+offload+chunk512+onedoc",
                "compiled+full+offload+budget0.8+chunk512+host20+hostembed+onedoc",
            ),
        ),
        Workload(
            "llama3-8b-dora",
            "llama-3-8b",
            ALL_LINEAR,
            dora=True,
            peer_checkpointing=(True,),
            variants=("compiled+full+onedoc",),
        ),
        Workload(
            "llama3-8b-lora-capped",
            "llama-3-8b",
            ALL_LINEAR,
            memory_cap_gib=16.7,
            peer_checkpointing=(True,),
            variants=(
                "compiled+full+offload+budget0.8+chunk512",
                "compiled+full+offload+budget0.8+chunk512+host16+hostembed",
                "compiled+full+offload+budget0.8+chunk512+host16+hostembed+keep2",
                "compiled+budget0.8+chunk512+host16+hostembed+onedoc+fp8+fp8base",
            ),
        ),
        Workload(
            "qwen3-moe-4l-lora-attn",
            "qwen3-30b-a3b",
            ATTENTION,
            layers=4,
            peer_checkpointing=(False,),
            variants=(
                "compiled",
                "compiled+graph+chunk4096",
                "compiled+graph+budget0.8",
            ),
        ),
        Workload(
            "deepseek-v2-lite-4l-lora-attn-experts",
            "deepseek-v2-lite",
            LATENT_ATTENTION + EXPERT_BANKS,
            layers=4,
            peer_checkpointing=(False,),
            variants=("compiled+onedoc", "compiled+graph+onedoc"),
        ),
        Workload(
            "qwen3-moe-4l-lora-attn-experts",
            "qwen3-30b-a3b",
            ATTENTION + EXPERT_BANKS,
            layers=4,
            peer_checkpointing=(False,),
            variants=("compiled", "compiled+graph"),
        ),
        Workload(
            "llama3.2-1b-lora",
            "llama-3.2-1b",
            ALL_LINEAR,
            peer_checkpointing=(False,),
            variants=(
                "compiled",
                "compiled+graph",
                "compiled+graph+budget0.8",
            ),
        ),
        Workload(
            "llama3.2-1b-full",
            "llama-3.2-1b",
            None,
            peer_checkpointing=(False,),
            variants=("compiled", "compiled+graph"),
        ),
        *(
            Workload(
                f"llama3-8b-lora-{gpus}gpu",
                "llama-3-8b",
                ALL_LINEAR,
                gpus=gpus,
                peer_checkpointing=(),
                variants=("compiled+ddp", "compiled", "compiled+tp2", "compiled+tp2+balanced"),
            )
            for gpus in (2, 4, 8)
        ),
        *(
            Workload(
                f"qwen3-moe-4l-lora-attn-experts-{gpus}gpu",
                "qwen3-30b-a3b",
                ATTENTION + EXPERT_BANKS,
                layers=4,
                gpus=gpus,
                peer_checkpointing=(),
                variants=("compiled", *(f"compiled+ep{ep}" for ep in (2, 4, 8) if ep <= gpus)),
            )
            for gpus in (2, 4, 8)
        ),
        Workload(
            "llama3.2-1b-full-fsdp2-2gpu",
            "llama-3.2-1b",
            None,
            gpus=2,
            peer_checkpointing=(),
            variants=(
                "compiled+ddp",
                "compiled+ddp+samedata",
                "compiled+ddp+balanced",
                "compiled+ddp+nccl8",
                "compiled+ddp+accum4",
                "compiled+ddp+tokens16384",
                "compiled+zero2+bf16reduce+nccl8",
                "compiled+zero2+bf16reduce+nccl8+accum4",
            ),
        ),
    )
}


@dataclass(frozen=True)
class Variant:
    """A tuneforge variant's settings, parsed from its name (`compiled+full+offload`)."""

    compiled: bool
    checkpointing: str = "none"
    offload: bool = False
    offload_activations: int = 0
    keep_activations: int = 0
    offload_embedding: bool = False
    memory_budget: float = 1.0
    loss_chunk_tokens: int = 1024
    zero2: bool = False
    bf16_reduce: bool = False
    ddp: bool = False
    one_document: bool = False
    fp32_lora: bool = False
    nccl_max_channels: int | None = None
    attention: str = "auto"
    cuda_graph: bool = False
    grad_accum_steps: int = 1
    same_data: bool = False
    tokens: int | None = None
    balanced: bool = False
    autotune: bool = False
    fp8: str | None = None
    fp8_scaling: str = "rowwise"
    fp8_base_weights: bool = False
    fp8_torchao: bool = False
    fp4: bool = False
    fp4_param: bool = False
    master_weights: bool | str = True
    tensor_parallel: int = 1
    expert_parallel: int = 1

    @classmethod
    def parse(cls, name: str) -> "Variant":
        mode, *options = name.split("+")
        if mode not in ("eager", "compiled"):
            raise TuneforgeError(f"variant {name!r}: start with eager or compiled")
        settings: dict = {"compiled": mode == "compiled"}
        flags = {"offload": "offload", "zero2": "zero2", "bf16reduce": "bf16_reduce", "ddp": "ddp",
                 "hostembed": "offload_embedding", "onedoc": "one_document",
                 "fp32lora": "fp32_lora", "graph": "cuda_graph", "samedata": "same_data",
                 "balanced": "balanced", "autotune": "autotune", "fp8base": "fp8_base_weights",
                 "fp4": "fp4", "fp4param": "fp4_param", "torchao": "fp8_torchao"}  # fmt: skip
        for option in options:
            if option in ("full", "selective"):
                settings["checkpointing"] = option
            elif option in ("flash4", "varlen", "sdpa", "cudnn"):
                settings["attention"] = option
            elif option in flags:
                settings[flags[option]] = True
            elif option in ("fp8", "fp8hybrid"):
                settings["fp8"] = "e4m3" if option == "fp8" else "hybrid"
            elif option == "tensorwise":
                settings["fp8_scaling"] = option
            elif option in ("nomaster", "compensated"):
                settings["master_weights"] = "compensated" if option == "compensated" else False
            elif option.startswith("budget") and _is_share(option.removeprefix("budget")):
                settings["memory_budget"] = float(option.removeprefix("budget"))
            elif option.startswith("chunk") and option.removeprefix("chunk").isdigit():
                settings["loss_chunk_tokens"] = int(option.removeprefix("chunk"))
            elif option.startswith("nccl") and option.removeprefix("nccl").isdigit():
                settings["nccl_max_channels"] = int(option.removeprefix("nccl"))
            elif option.startswith("accum") and _is_count(option.removeprefix("accum")):
                settings["grad_accum_steps"] = int(option.removeprefix("accum"))
            elif option.startswith("tokens") and _is_count(option.removeprefix("tokens")):
                settings["tokens"] = int(option.removeprefix("tokens"))
            elif option.startswith("host") and option.removeprefix("host").isdigit():
                settings["offload_activations"] = int(option.removeprefix("host"))
            elif option.startswith("keep") and option.removeprefix("keep").isdigit():
                settings["keep_activations"] = int(option.removeprefix("keep"))
            elif option[:2] in ("tp", "ep") and _is_count(option[2:]):
                key = "tensor_parallel" if option.startswith("tp") else "expert_parallel"
                settings[key] = int(option[2:])
            else:
                raise TuneforgeError(
                    f"variant {name!r}: unknown option {option!r} (full, selective, offload, "
                    "host<blocks>, keep<blocks>, hostembed, budget<share>, chunk<tokens>, zero2, "
                    "bf16reduce, ddp, nccl<channels>, flash4, varlen, sdpa, cudnn, onedoc, fp32lora, graph, "
                    "accum<micro-batches>, tokens<per micro-batch>, samedata, balanced, autotune, "
                    "fp8, fp8hybrid, tensorwise, fp8base, torchao, fp4, fp4param, nomaster, "
                    "compensated, tp<ranks>, ep<ranks>)"
                )
        variant = cls(**settings)
        if (
            variant.fp8_base_weights or variant.fp8_torchao or variant.fp8_scaling != "rowwise"
        ) and not variant.fp8:
            raise TuneforgeError(
                f"variant {name!r}: fp8base, torchao and tensorwise go with fp8 or fp8hybrid"
            )
        if variant.fp4_param and not variant.fp4:
            raise TuneforgeError(f"variant {name!r}: fp4param goes with fp4")
        return variant

    def precision(self) -> PrecisionSection:
        return PrecisionSection(
            fp8=self.fp8,
            fp8_scaling=self.fp8_scaling,
            fp8_base_weights=self.fp8_base_weights,
            fp8_implementation="torchao" if self.fp8_torchao else "tuneforge",
            fp4="e2m1" if self.fp4 else None,
            fp4_param=self.fp4_param,
            master_weights=self.master_weights,
        )


PER_GPU_WORK = ("samedata", "accum", "tokens")
"""Variant options that change the work of each GPU: kept in the one-GPU run it scales against."""


def baseline_variant(variant: str) -> str:
    """The one-GPU run a multi-GPU variant's scaling is measured against: compiled blocks and
    the same work per GPU (`compiled+ddp+accum4` → `compiled+accum4`)."""
    options = variant.split("+")[1:]
    return "+".join(["compiled", *(o for o in options if o.startswith(PER_GPU_WORK))])


def _is_count(text: str) -> bool:
    return text.isdigit() and int(text) >= 1


def _is_share(text: str) -> bool:
    try:
        return 0 < float(text) <= 1
    except ValueError:
        return False
