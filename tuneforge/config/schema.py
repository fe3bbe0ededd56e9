"""The typed tree of one run's configuration. YAML only fills it; unknown keys are errors.
Each field's docstring is its help text (shown by `tuneforge config fields` and in errors).
Paths marked `InputPath` are read by the run, relative ones against the directory of the YAML
file that set them; `run.output_dir` resolves against the working directory."""

import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tuneforge.config.durations import parse_duration
from tuneforge.config.hub import HubName


class RelativeToConfigFile:
    """Marks a path field that resolves against the directory of the YAML file setting it; `hub`:
    or names a Hugging Face hub id (`org/name`), resolved through the hub's cache
    (`config/hub.py`)."""

    def __init__(self, hub: bool = False) -> None:
        self.hub = hub


InputPath = Annotated[Path, RelativeToConfigFile()]
ModelPath = Annotated[Path, RelativeToConfigFile(hub=True)]

DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True
    )


class RunSection(Section):
    name: str = Field("run", min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    """Run name: letters, digits, '.', '_' or '-'; names the run directory by default."""
    output_dir: Path | None = None
    """Run directory (config, metrics, checkpoints); default `runs/<run.name>`. Never put a job id in it."""
    env: dict[str, str] = {}
    """Environment the SLURM job scripts export (e.g. PYTORCH_ALLOC_CONF, NCCL_SOCKET_IFNAME, HF_HOME)."""

    @property
    def directory(self) -> Path:
        return self.output_dir if self.output_dir is not None else Path("runs") / self.name


class ModelSection(Section):
    name: str | None = None
    """Catalog shape to build with random weights (e.g. `demo-tiny`, `llama-3-8b`); see `tuneforge models`."""
    path: ModelPath | None = None
    """Local Hugging Face model directory (config.json + *.safetensors) to fine-tune, or a hub id (`Qwen/Qwen3-8B`) resolved through the Hugging Face cache (downloaded there unless HF_HUB_OFFLINE is set); the run's config.yaml records the snapshot and its commit."""
    revision: str | None = None
    """With a hub id: the branch, tag or commit to use (default: main); the run records the commit it resolved to."""
    num_layers: int | None = Field(None, ge=1)
    """Keep only the first N decoder layers: a proxy of a real shape that fits a small machine."""
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    """Dtype of the base weights and of the computation."""
    attention: Literal["auto", "flash4", "varlen", "sdpa", "eager"] = "auto"
    """Attention backend; `auto` picks the fastest that works on the device and logs which one runs."""
    init_std: float = Field(0.02, gt=0)
    """Standard deviation of the random initialisation used for catalog shapes."""
    quantize: Literal["nf4", "fp4"] | None = None
    """Hold the frozen linears of the decoder blocks in 4 bits (bitsandbytes' NF4 or FP4, blocks of 64 with their absmax) and dequantise them into `dtype`, the compute dtype, at each product: QLoRA (needs LoRA; a teacher may be quantised too)."""
    double_quant: bool = True
    """With quantize: quantise the blocks' absmaxes again (8 bits, blocks of 256), QLoRA's double quantisation (~0.37 bits per weight less)."""

    @staticmethod
    def from_string(text: str) -> dict[str, str]:
        """A model given as one string (`distill.teacher: DIR`): its `path` (a directory, `./dir`,
        or a hub id `org/name`) or, without a slash, its catalog `name`."""
        is_path = "/" in text or text.startswith((".", "~"))
        return {"path": text} if is_path else {"name": text}


class TokenizerSection(Section):
    path: ModelPath | None = None
    """Local tokenizer directory in the HF layout, or a hub id resolved as model.path is; default: model.path."""
    revision: str | None = None
    """With a hub id: the branch, tag or commit to use; the run records the commit."""
    chat_template: str | None = None
    """Chat template instead of the tokenizer's own: chatml, llama3, alpaca, squad, or a Jinja template."""


class DataSource(Section):
    path: InputPath | None = None
    """A `.jsonl`, `.json` (a list) or `.parquet` file, a directory or glob of them, a dataset saved with `datasets.save_to_disk`, or (format mlperf) a packed `.npy`; with `hub`, the snapshot it resolved to."""
    hub: Annotated[str, HubName("dataset")] | None = None
    """Instead of path: a hub dataset id (`rajpurkar/squad`), resolved through the Hugging Face cache (downloaded there unless HF_HUB_OFFLINE is set) and read with `datasets`."""
    split: str = "train"
    """With hub: the split to read."""
    subset: str | None = None
    """With hub: the subset (configuration) to read, where the dataset has several."""
    revision: str | None = None
    """With hub: the branch, tag or commit; the run records the commit."""
    format: Literal[
        "openai", "messages", "alpaca", "squad", "sharegpt", "text", "preference", "mlperf"
    ] = "openai"
    """Record format: openai/messages, alpaca, squad, sharegpt, text (every token trained), preference, or mlperf (pre-tokenised packs: input_ids, loss_mask, seq_start_id)."""
    weight: float = Field(1.0, gt=0)
    """Share of this source in the mix: 2 repeats each record twice per epoch, 0.5 keeps a seeded half."""
    field_map: dict[str, str] = {}
    """Rename fields: the format's field name -> the name in the file (e.g. {output: response})."""
    metadata: InputPath | None = None
    """Format mlperf: the packing metadata JSON written with the `.npy` (pack_size, max_samples_per_bin, ...); the data is checked against it."""

    @property
    def files(self) -> Path:
        """Where the source's files are: its path, or the hub snapshot it resolved to."""
        assert self.path is not None, "a hub source's path is its snapshot, set when loaded"
        return self.path

    @model_validator(mode="after")
    def _a_path_or_a_hub_id(self) -> "DataSource":
        if self.path is None and self.hub is None:  # (a hub id's snapshot becomes its path)
            raise ValueError("give a data source a path or a hub dataset id (hub)")
        return self


class DataSection(Section):
    train: list[DataSource] = Field(min_length=1)
    """Training sources."""
    eval: list[DataSource] = []
    """Held-out sources for evaluation loss and accuracy; empty disables evaluation."""
    eval_fraction: float | None = Field(None, gt=0, lt=1)
    """Instead of data.eval: hold out this seeded fraction of the training records."""
    max_seq_len: int = Field(2048, ge=8)
    """Longest tokenised conversation kept; longer ones are handled by `on_too_long`."""
    on_too_long: Literal["truncate", "drop", "error"] = "drop"
    """What to do with a conversation longer than max_seq_len (unless data.split_long)."""
    cache_dir: Path | None = None
    """Where tokenised data is cached (default ~/.cache/tuneforge/tokenized); see data.cache."""
    cache: bool = True
    """Cache tokenised data, keyed by the contents of sources, tokenizer, template and options."""
    packing: Literal["ffd", "bfd", "none"] = "ffd"
    """How documents fill micro-batches: packed first-fit or best-fit decreasing, or `none` (padded to the longest, for comparison)."""
    balance_ranks: bool = False
    """With several data-parallel ranks, give each step's ranks micro-batches of similar attention work (the sum of their documents' squared lengths): a step waits for its slowest rank. Within windows of 8 steps micro-batches are sorted by it and dealt in neighbouring groups, the groups' order shuffled. Off: each rank takes every world_size-th micro-batch of the shuffled order."""
    split_long: bool = False
    """Cut documents longer than max_seq_len into max_seq_len pieces (each attends only within itself) instead of applying on_too_long."""
    tokenize_workers: int | None = Field(None, ge=0)
    """Processes that render and tokenise records; 0 tokenises in this process; unset: one per CPU (at most 8) for large datasets."""
    on_bad_record: Literal["error", "skip"] = "error"
    """A malformed record stops the run (`error`, listing file, line and reason) or is left out (`skip`, counted)."""
    train_on: Literal["assistant", "last_assistant", "all"] = "assistant"
    """Tokens that carry loss: every assistant reply (with its end-of-turn token, not the whitespace after it), only the last one, or all."""
    empty_think: Literal["train", "mask"] = "train"
    """The empty `<think></think>` block a template writes before a reply without reasoning (Qwen3's, on the last reply): trained as part of the reply (the model learns to answer without thinking), or masked (seen, not trained)."""
    date_string: str | None = "26 Jul 2024"
    """The date chat templates that stamp today's date write (Llama 3.x: `Today Date:`), so that a run's tokens do not depend on the day they are made; null lets the template write today's."""


class LoraSection(Section):
    enabled: bool = True
    """Train low-rank adapters (True) or all weights (False)."""
    rank: int = Field(16, ge=1)
    """Rank r of each adapter."""
    alpha: float = Field(32.0, gt=0)
    """Scaling numerator: the adapter output is multiplied by alpha / rank (alpha / sqrt(rank) with use_rslora)."""
    use_rslora: bool = False
    """Rank-stabilised scaling alpha / sqrt(rank)."""
    use_dora: bool = False
    """DoRA: each adapted weight as a trained magnitude times the direction of W + s·B·A (as PEFT's `use_dora`); dense linears only, on a base in the model's dtype."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout in the adapter branch."""
    dropout_position: Literal["pre", "post"] = "pre"
    """Dropout on the adapter input (`pre`, as PEFT) or on its output (`post`)."""
    init: Literal["default", "kaiming", "xavier", "gaussian", "pissa", "olora"] = "kaiming"
    """How the adapters start: A kaiming-uniform (`default` or `kaiming`: PEFT's default), xavier-normal (Megatron's) or gaussian with std 1/rank, and B zero; or, as PEFT defines them, `pissa` (A, B from W's r principal singular values and vectors) or `olora` (from W's QR decomposition), s·B·A then taken out of the frozen base. Saved as the equivalent rank-2r LoRA on the original base."""
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS), min_length=1
    )
    """What to adapt: HF leaf names (`q_proj` ... `down_proj`), Megatron names (`linear_qkv`, `linear_proj`, `linear_fc1`, `linear_fc2`), dotted suffixes (`self_attn.q_proj`), expert banks (`experts.gate_up_proj`, `experts.down_proj`), globs (`*.layers.1.*`), regexes (`re:...`), or `all-linear`. Left at its default, entries the model lacks (e.g. dense MLP names on an all-MoE model) are skipped."""
    exclude_modules: list[str] = []
    """Patterns (as in target_modules) of modules never to adapt."""
    rank_pattern: dict[str, int] = {}
    """Per-pattern rank: {pattern: rank}; the first matching pattern wins."""
    alpha_pattern: dict[str, float] = {}
    """Per-pattern alpha: {pattern: alpha}; the first matching pattern wins."""
    modules_to_save: list[str] = []
    """Modules trained in full and saved with the adapter, by HF name (e.g. embed_tokens, lm_head when tokens were added)."""
    share_expert_adapters: bool = False
    """One adapter shared by all experts of a bank instead of one per expert."""
    init_adapter: InputPath | None = None
    """A LoRA adapter directory (PEFT layout, e.g. an earlier run's `adapter/`) whose weights the adapters start from, to continue training it (SFT, or preference training after SFT); its shapes must match this section's."""
    compute_dtype: Literal["model", "float32"] = "model"
    """Precision of the adapter matmuls: the model's (bf16: the adapters' fp32 weights are cast for each matmul, no fp32 copy of the activations) or float32 (PEFT's default: the input is cast to fp32; slower, more memory)."""


class TrainSection(Section):
    objective: Literal["sft", "dpo", "distill"] = "sft"
    """What the run trains for: `sft` (next-token cross-entropy on the supervised tokens), `dpo` (preference pairs: DPO, IPO or SimPO as the `dpo` section says; the data in the preference format) or `distill` (the supervised tokens' next-token distributions of the `distill` section's teacher, with cross-entropy)."""
    max_steps: int | None = Field(None, ge=1)
    """Optimizer steps to run; set this or `epochs`."""
    epochs: float | None = Field(None, gt=0)
    """Passes over the training data; used when max_steps is not set."""
    tokens_per_micro_batch: int = Field(4096, ge=8)
    """Token budget of one packed micro-batch (its flat length); must be >= data.max_seq_len."""
    loss_chunk_tokens: int = Field(1024, ge=64)
    """Tokens per chunk of the loss: one chunk's logits exist at a time (tokens x vocabulary x 6 bytes in a bf16 model)."""
    grad_accum_steps: int = Field(1, ge=1)
    """Micro-batches per optimizer step."""
    lr: float = Field(2e-4, gt=0)
    """Peak learning rate."""
    min_lr: float = Field(0.0, ge=0)
    """Learning rate at the end of the decay."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up steps from 0 to lr."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warm-up, from lr to min_lr."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay (never applied to norms and biases)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    clip_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this value; null disables clipping."""
    seed: int = 0
    """Seed for weights, adapters, data order and dropout."""
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    """Recompute block activations in backward to save memory: every block (`full`) or every k-th (`selective`)."""
    checkpoint_every: int = Field(2, ge=1)
    """With activation_checkpointing: selective, recompute every k-th block."""
    offload_checkpoints: bool = False
    """With activation checkpointing, keep each checkpointed block's input in pinned host memory
    instead of on the GPU (one process; no MoE router aux loss)."""
    offload_activations: int = Field(0, ge=0)
    """Blocks, spread evenly, whose saved activations go to pinned host memory in the forward and come back for their backward, instead of staying on the GPU or being recomputed (one process). Each costs its activations' round trip over PCIe, overlapped with compute: with checkpointing, blocks save their recomputation for one block's activations more at the peak (they come back into two staging buffers, in turn)."""
    keep_activations: int = Field(0, ge=0)
    """With activation checkpointing: the last N of the blocks it would recompute keep their activations on the GPU instead (fills the memory checkpointing leaves; each such block saves one block's recomputation). `tuneforge plan` predicts the memory."""
    offload_embedding: bool = False
    """Keep the frozen input embedding in pinned host memory: each micro-batch's rows are gathered there and copied to the GPU ([tokens, dim] per micro-batch instead of [vocabulary, dim] on the GPU). Needs a frozen, untied embedding (a LoRA run) and one process."""
    compile: bool = False
    """Compile each block with torch.compile, and the loss's softmax and gradient per chunk."""
    compile_memory_budget: float = Field(1.0, gt=0, le=1)
    """With compile: the share of its activations each compiled block may keep for backward (torch's activation_memory_budget); below 1, cheap values (norm outputs, the SwiGLU product) are recomputed in backward instead."""
    cuda_graph: bool = False
    """Capture the whole optimizer step as one CUDA graph after two eager steps and replay it: the host queues one launch per step instead of thousands (for runs where Python cannot keep the GPU busy: small models, MoE). Batches are brought to a fixed shape (padded to tokens_per_micro_batch, document slots for the most documents seen), and the loss projects every row. One CUDA GPU, attention flash4 or varlen, nothing offloaded to host memory; memory stays reserved for the graph."""
    eval_steps: int | None = Field(None, ge=1)
    """The older name of `eval.every_steps`."""
    on_nonfinite: Literal["skip", "stop"] = "skip"
    """A step with NaN/Inf loss or gradients: skip its update (`skip`) or stop the run (`stop`)."""
    max_nonfinite_steps: int = Field(10, ge=1)
    """Stop anyway after this many non-finite steps in a row."""
    time_limit: str | None = None
    """Wall-clock budget of this job (`90m`, `4h`, `01:30:00`, `2-00:00:00`); under SLURM the job's end time is used when sooner. The run saves and exits before it."""

    @field_validator("time_limit")
    @classmethod
    def _parse_time_limit(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)
        return value


class PrecisionSection(Section):
    fp8: Literal["e4m3", "hybrid"] | None = None
    """FP8 matmuls (`e4m3` or `hybrid`: E4M3 forward, E5M2 backward); mutually exclusive with fp4. With model.quantize: the 4-bit base dequantised into FP8 for each product."""
    fp8_scaling: Literal["rowwise", "tensorwise"] = "rowwise"
    """FP8 scales: one per token and output channel (`rowwise`) or one per tensor (`tensorwise`)."""
    fp8_implementation: Literal["tuneforge", "torchao"] = "tuneforge"
    """Full fine-tuning's trained linears in FP8 through tuneforge's own `torch._scaled_mm` products or torchao's float8 training (`Float8Linear`; needs torchao; under FSDP2 with tensorwise scales it all-gathers the weights in FP8). Frozen LoRA bases always use tuneforge's, quantised once."""
    fp8_base_weights: bool = False
    """LoRA: keep the frozen base weights only in FP8 (about half the memory); otherwise their bf16 values stay beside the FP8 copy."""
    fp4: Literal["e2m1"] | None = None
    """FP4 numerics (E2M1 elements with block scales) for the frozen base linears, emulated (quantise, dequantise, bf16 product) where the GPU has no FP4 tensor cores; mutually exclusive with fp8."""
    fp4_recipe: Literal["nvfp4", "mxfp4"] = "nvfp4"
    """FP4 block-scaling recipe."""
    fp4_param: bool = False
    """Keep the frozen base weights only as FP4 codes and scales, dequantised at each use (requires fp4)."""
    fp4_param_gather: bool = False
    """All-gather weights in FP4 (requires fp4_param)."""
    master_weights: bool | Literal["compensated"] = True
    """Trained 16-bit weights (full fine-tuning, lora.modules_to_save): `true` keeps an fp32 master copy of each and fp32 AdamW states, computing in the model's dtype (under FSDP2 the shards are the fp32 masters); `false` keeps weights and AdamW states in the model's dtype only (half the optimizer memory, but updates below half a bf16 step are lost); `compensated` keeps the weights in the model's dtype plus a same-size remainder of what rounding took off (Kahan), with fp32 states."""


class DpoSection(Section):
    loss: Literal["sigmoid", "ipo", "simpo"] = "sigmoid"
    """`sigmoid` (DPO), `ipo`, or `simpo` (reference-free, on the replies' mean log-probabilities, with `simpo_gamma`)."""
    beta: float = Field(0.1, gt=0)
    """Strength of the reference's pull (DPO, IPO), or SimPO's reward scale."""
    label_smoothing: float = Field(0.0, ge=0, lt=0.5)
    """The probability that a pair's preference is flipped (conservative DPO; sigmoid and simpo)."""
    simpo_gamma: float = Field(0.5, ge=0)
    """SimPO's target margin between the chosen and rejected rewards."""
    sft_weight: float = Field(0.0, ge=0)
    """Weight of the chosen reply's mean negative log-likelihood added to each pair's loss."""
    reference: Literal["auto", "adapters_off", "frozen_copy", "precomputed"] = "auto"
    """The model as it was when preference training started: `adapters_off` (LoRA on a fresh adapter: the base with the adapters disabled, no second copy), `frozen_copy` (a frozen copy: full fine-tuning, or LoRA continuing `lora.init_adapter`), `precomputed` (its log-probabilities of every reply computed in one pass before training and cached with the tokenised data: no copy and no reference forward per step), or `auto` (adapters_off or frozen_copy, the one that applies)."""


class DistillSection(Section):
    teacher: ModelSection | None = None
    """The teacher: a local model directory or hub id (`path`) or a catalog shape (`name`, random weights: a proxy for measuring), with its own `dtype` and `num_layers`; it must share the student's vocabulary. A plain string is the path (a directory, `./dir`, or `org/name`) or, without a slash, the catalog name."""
    loss: Literal["forward_kl", "reverse_kl", "jsd"] = "forward_kl"
    """KL(teacher ‖ student), KL(student ‖ teacher), or the generalised Jensen-Shannon divergence with `jsd_beta`."""
    jsd_beta: float = Field(0.5, gt=0, lt=1)
    """The JSD's mixture weight of the teacher."""
    temperature: float = Field(1.0, gt=0)
    """Both distributions are softened by it; the loss is multiplied by its square."""
    kd_weight: float = Field(0.5, ge=0, le=1)
    """Share of the distillation loss in each token's loss; the cross-entropy on the data takes the rest."""
    top_k: int | None = Field(None, ge=1)
    """Distil over the teacher's k likeliest tokens only (renormalised), as a cache of its logits keeps them."""
    teacher_logits: Literal["online", "cached"] = "online"
    """`online`: the teacher runs beside the student every step; `cached`: it runs once over the data before training and its top-k logits and token ids are kept memory-mapped on disk (keyed by the tokenised data and the teacher), so that it need not fit beside the student (needs top_k)."""


class CheckpointSection(Section):
    save_steps: int | None = Field(None, ge=1)
    """Save a checkpoint every N steps (null: only at the end). Keep it below one job's step budget."""
    keep_last: int = Field(2, ge=1)
    """How many step checkpoints to keep."""
    save_final: bool = True
    """Save the trained weights (or the adapter) when the run ends."""
    exit_margin_s: float = Field(60.0, ge=0)
    """Least time kept before a time limit to save and exit; the loop adds its measured step and checkpoint times."""


class LoggingSection(Section):
    log_steps: int = Field(1, ge=1)
    """Write a metrics line every N steps."""
    progress: bool = True
    """Show a progress bar on the terminal."""
    tensorboard: bool = True
    """Write TensorBoard event files to <run dir>/tensorboard."""
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = []
    """Experiment trackers given the run's config and every metrics line: wandb (WANDB_MODE=offline writes to the run directory) and mlflow (MLFLOW_TRACKING_URI, or <run dir>/mlruns), each with its extra installed; tensorboard here is the same as tensorboard: true."""
    project: str = "tuneforge"
    """The W&B project and the MLflow experiment the run is logged to."""
    peak_tflops: float | None = Field(None, gt=0)
    """Peak dense bf16 TFLOP/s of one device for MFU (default: from the GPU's name)."""
    projection_step: int = Field(25, ge=2)
    """Step at which the projected total time (and jobs needed under a time limit) is printed."""


class EvalSection(Section):
    every_steps: int | None = Field(None, ge=1)
    """Evaluate held-out loss every N steps (and at the start and the end), so that the held-out curve has points between them."""
    num_samples: int = Field(0, ge=0)
    """Held-out prompts answered by greedy decoding for exact-match accuracy (0 disables)."""
    max_new_tokens: int = Field(32, ge=1)
    """Longest reply generated when measuring accuracy."""


class ParallelSection(Section):
    strategy: Literal["auto", "single", "ddp", "fsdp"] = "auto"
    """How to spread the run across devices; `auto` is `single` on one process and, on several, `ddp` where every GPU can hold the whole model (its predicted peak within 85% of the GPU; only gradients cross between GPUs), else `fsdp`."""
    zero_stage: Literal[2, 3] | None = None
    """FSDP sharding: 2 keeps parameters gathered after forward (ZeRO-2), 3 reshards them (ZeRO-3)."""
    reshard_after_forward: bool | None = None
    """FSDP2's name for the same choice: False is ZeRO-2, True is ZeRO-3."""
    reduce_dtype: Literal["float32", "model"] = "float32"
    """FSDP2 gradient reduction: in float32 (exact sums of bf16 gradients) or in the model's dtype (half the traffic)."""
    nccl_max_channels: int | None = Field(None, ge=1)
    """NCCL's channels per collective (sets NCCL_MAX_NCHANNELS before the process group starts; null: NCCL's own choice). Each channel's kernel takes an SM from the compute it overlaps; over NVLink a few channels still move a block's weights in well under a millisecond (docs/training.md)."""


class RunConfig(Section):
    """The whole configuration of one run."""

    run: RunSection = RunSection()
    """Name and run directory."""
    model: ModelSection
    """Which model to fine-tune."""
    tokenizer: TokenizerSection = TokenizerSection()
    """Which tokenizer and chat template."""
    data: DataSection
    """Training and held-out data."""
    lora: LoraSection = LoraSection()
    """Low-rank adapters, or full fine-tuning."""
    train: TrainSection
    """Optimisation."""
    precision: PrecisionSection = PrecisionSection()
    """Low-precision matmuls."""
    dpo: DpoSection = DpoSection()
    """Preference training (train.objective: dpo)."""
    distill: DistillSection = DistillSection()
    """Knowledge distillation (train.objective: distill)."""
    checkpoint: CheckpointSection = CheckpointSection()
    """Saving."""
    logging: LoggingSection = LoggingSection()
    """Metrics and progress."""
    eval: EvalSection = EvalSection()
    """Held-out evaluation: how often, and generation-based accuracy."""
    parallel: ParallelSection = ParallelSection()
    """Devices and sharding."""

    @model_validator(mode="after")
    def _evaluation_steps_by_their_older_name(self) -> "RunConfig":
        if self.eval.every_steps is None and self.train.eval_steps is not None:
            self.eval.every_steps = self.train.eval_steps
        return self


def section_type(annotation: Any) -> type[BaseModel] | None:
    """The config class inside `Section`, `Section | None` or `list[Section]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = section_type(arg)
        if found is not None:
            return found
    return None
