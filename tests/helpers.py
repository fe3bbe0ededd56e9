"""Tiny random Hugging Face models saved in the HF layout, for parity tests."""

from pathlib import Path

import torch
import torch.nn.functional as F
import transformers

from tuneforge.data.packing import IGNORE_INDEX
from tuneforge.data.token_store import TokenStore, make_example
from tuneforge.execution.block_wrappers import BlockWrapping, wrap_blocks
from tuneforge.models.args import ModelArgs
from tuneforge.models.decoder import Decoder
from tuneforge.peft.apply import apply_lora, lora_modules

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)

DEEPSEEK_V2 = {  # V2-Lite's layout, small: uncompressed queries, a dense first layer
    "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": None, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "n_shared_experts": 2, "first_k_dense_replace": 1,
    "routed_scaling_factor": 1.5, "norm_topk_prob": False, "topk_method": "greedy",
    "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 0.5,
    },
}  # fmt: skip

GEMMA3 = {  # one local layer (window 8), one global with linear rotary scaling, tied embeddings
    "head_dim": 24, "query_pre_attn_scalar": 20, "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": True,
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
}  # fmt: skip

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama3_rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "head_dim": 16,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "output_router_logits": True,
        },
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", DEEPSEEK_V2),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA3),
    "deepseek_v2_q": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        DEEPSEEK_V2 | {"q_lora_rank": 24, "first_k_dense_replace": 0},
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {"num_local_experts": 8, "num_experts_per_tok": 2, "output_router_logits": True},
    ),
}


def save_tiny_model(directory: Path, family: str = "llama", seed: int = 0, **overrides):
    """Build a random 2-layer transformers model of `family`, save it, return it in eval mode."""
    config_class, model_class, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**(COMMON | extra | overrides))
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # random norms and biases, so that their loading is tested too
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "bias")):
                param.normal_(1.0 if name.endswith("weight") else 0.0, 0.1)
    model.save_pretrained(directory)
    return model


def hf_name_of(adapter, name: str, expert: int | None = None) -> str:
    """The name of our parameter `name` in transformers' loaded model."""
    hf_name = adapter.to_hf(name, expert)
    assert hf_name is not None, name
    return adapter.runtime_name(hf_name)


def save_tiny_llama(directory: Path, seed: int = 0, **overrides):
    return save_tiny_model(directory, "llama", seed, **overrides)


def save_tiny_reward_llama(directory: Path, seed: int = 0, vocab_size: int = 96, pad: int = 0):
    """A random transformers reward model (a one-label Llama sequence classifier), saved."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        **(COMMON | {"vocab_size": vocab_size, "num_labels": 1, "pad_token_id": pad})
    )
    model = transformers.LlamaForSequenceClassification(config).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(1.0, 0.1)
    model.save_pretrained(directory)
    return model


def save_tiny_chat_model(directory: Path):
    """A tiny Llama with the demo tokenizer (and its chat template) beside it."""
    import shutil

    from tuneforge.assets import DEMO_TOKENIZER_DIR

    save_tiny_llama(directory, vocab_size=512)
    for file in DEMO_TOKENIZER_DIR.iterdir():
        shutil.copy(file, directory / file.name)
    return directory


QUIET_DEMO = [
    "data.eval=[]",
    "eval.every_steps=null",
    "eval.num_samples=0",
    "logging.log_steps=1",
    "logging.progress=false",
    "logging.tensorboard=false",
]
"""Demo overrides for a test run: no held-out data or evaluation, every step logged, no progress
bar or TensorBoard files."""


def train_demo(run_dir: Path, overrides: list[str]) -> list[dict]:
    """The demo trained in this process with `overrides` into `run_dir`: its metrics records."""
    from tuneforge.config import load_config
    from tuneforge.runs.files import read_metrics
    from tuneforge.train.loop import Trainer

    repo = Path(__file__).resolve().parents[1]
    config = load_config(
        repo / "examples" / "demo.yaml",
        [*overrides, f"run.output_dir={run_dir}", f"data.cache_dir={run_dir.parent / 'cache'}"],
    )
    trainer = Trainer(config)
    try:
        trainer.setup()
        trainer.train()
    finally:
        trainer.close()
    return read_metrics(run_dir / "metrics.jsonl")


def packed_batch(tokens, labels, packed):
    """A `PackedBatch` of `tokens` with their `labels`, every label not ignored counted as
    supervised."""
    from tuneforge.data.packing import IGNORE_INDEX, PackedBatch

    return PackedBatch(tokens, labels, packed, int((labels != IGNORE_INDEX).sum()))


def tiny_decoder(tied: bool) -> Decoder:
    args = ModelArgs(
        vocab_size=64, dim=32, num_layers=1, num_heads=4, num_kv_heads=2, ffn_dim=48,
        tie_embeddings=tied,
    )  # fmt: skip
    return Decoder(args, "sdpa")


def lora_gradients(checkpointing="none", dropout=0.0, **wrap):
    """Gradients of a tiny LoRA model (the first block's input needs no gradient: the
    embedding is frozen) after one backward, and the loss."""
    from tuneforge.peft.apply import apply_lora

    args = ModelArgs(vocab_size=64, dim=32, num_layers=3, num_heads=4, num_kv_heads=2, ffn_dim=48)
    torch.manual_seed(0)
    model = Decoder(args, "sdpa")
    model.init_weights(0.02, torch.Generator().manual_seed(0))
    lora = {"target_modules": ["all-linear"], "rank": 4, "alpha": 8, "dropout": dropout}
    apply_lora(model, lora, torch.Generator().manual_seed(1), torch.float32)
    for module in model.modules():  # a non-zero B, so every adapter gets a gradient
        if hasattr(module, "lora_B"):
            torch.nn.init.normal_(
                module.lora_B, std=0.1, generator=torch.Generator().manual_seed(3)
            )
    wrap_blocks(model, BlockWrapping(checkpointing, **wrap))
    torch.manual_seed(5)  # the dropout masks
    loss = gradients_and_loss(model)
    return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def gradients_and_loss(model):
    tokens = torch.randint(0, 64, (30,), generator=torch.Generator().manual_seed(2))
    loss = model(tokens, cu_seqlens=torch.tensor([0, 10, 30])).logsumexp(-1).mean()
    loss.backward()
    return loss.item()


def packed_training_losses(objective, params, lr: float, steps: int) -> list[float]:
    """`steps` fused-AdamW steps of `objective` on one packed batch on the GPU: 2,048 tokens of a
    learnable subset of the vocabulary in three documents. The per-token loss of each step."""
    from tuneforge.packed import PackedSequences

    optimizer = torch.optim.AdamW(params, lr=lr, fused=True)
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 2000, (2048,), generator=generator).cuda()
    packed = PackedSequences.from_lengths([700, 900, 448], "cuda")
    history = []
    for _ in range(steps):
        loss_sum = objective(packed_batch(tokens, tokens.roll(-1), packed)).loss_sum
        (loss_sum / tokens.numel()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        history.append(loss_sum.item() / tokens.numel())
    return history


# adapters against peft (`test_lora_peft.py`, `test_dora.py`, `test_qlora.py`, ...)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOKENS = torch.randint(0, 128, (21,), generator=torch.Generator().manual_seed(5))


def our_logits(model):
    with torch.no_grad():
        return model(TOKENS[None])[0]


def peft_logits(peft_model):
    with torch.no_grad():
        return peft_model(TOKENS[None]).logits[0]


def randomise_adapters(model, seed=0):
    """B away from zero (and DoRA's magnitudes away from the base's norms): every term counts.
    Drawn on the host, so that a model on any device gets the same values."""
    generator = torch.Generator().manual_seed(seed)
    for module in lora_modules(model).values():
        with torch.no_grad():
            module.lora_B.copy_(0.1 * torch.randn(module.lora_B.shape, generator=generator))
            magnitude = getattr(module, "lora_magnitude", None)
            if magnitude is not None:
                noise = torch.randn(magnitude.shape, generator=generator)
                magnitude.mul_(1 + 0.1 * noise.to(magnitude.device))


def issues_of(error) -> dict[str, str]:
    """A `ConfigError`'s messages by the field they are about."""
    return {issue.path: str(issue) for issue in error.issues}


def pair_store(pairs: int) -> TokenStore:
    """Pairs sharing a prompt (not supervised), each reply supervised."""
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(pairs):
        prompt = torch.randint(0, 64, (6,), generator=generator).tolist()
        for reply_length in torch.randint(3, 9, (2,), generator=generator).tolist():
            reply = torch.randint(0, 64, (reply_length,), generator=generator).tolist()
            ids = prompt + reply
            examples.append(make_example(ids, [False] * len(prompt) + [True] * len(reply)))
    return TokenStore.from_examples(examples)


def adapted_tiny_model(trained: bool):
    torch.manual_seed(0)
    model = tiny_decoder(tied=False)
    apply_lora(model, {"target_modules": ["all-linear"], "rank": 4, "alpha": 8})
    if trained:  # adapters away from their start, so the policy differs from the reference
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.3, generator=torch.Generator().manual_seed(len(name)))
    return model


def reply_logps(model, ids, labels):
    """A reply's summed log-probability through the model alone, with its full logits."""
    logits = model(torch.tensor(ids)[None])[0].float()
    labels = torch.tensor(labels)
    supervised = labels != IGNORE_INDEX
    return F.log_softmax(logits, -1)[supervised].gather(1, labels[supervised][:, None]).sum()


def random_packed_batch(vocab_size: int, tokens: int, one_document: bool, seed: int):
    """`tokens` random token ids packed as documents of random lengths (or one document), each
    token supervised but a document's last."""
    from tuneforge.data.packing import PackedBatch
    from tuneforge.packed import PackedSequences

    generator = torch.Generator().manual_seed(seed)
    lengths = [tokens]
    if not one_document:
        lengths = []
        while sum(lengths) < tokens:
            lengths.append(int(torch.randint(8, max(9, tokens // 3), (), generator=generator)))
        lengths[-1] -= sum(lengths) - tokens
        lengths = [length for length in lengths if length > 0]
    ids = torch.randint(0, vocab_size, (tokens,), generator=generator)
    labels = ids.roll(-1)
    labels[torch.tensor(lengths).cumsum(0) - 1] = IGNORE_INDEX
    supervised = int((labels != IGNORE_INDEX).sum())
    return PackedBatch(ids, labels, PackedSequences.from_lengths(lengths), supervised)


def assert_gradients_equal(hf, ours) -> None:
    """Each parameter of `ours` (a tuneforge model) against its namesake in `hf` (transformers'):
    each parameter's gradient within 1e-4 relative, or 1e-5 of its largest element (an
    element where terms cancel keeps only the rounding of its terms)."""
    from tuneforge.models.hf.adapter import adapter_for

    hf_params = dict(hf.named_parameters())
    adapter = adapter_for(ours.args.family)
    for name, param in ours.named_parameters():
        expected = hf_params[hf_name_of(adapter, name)].grad
        torch.testing.assert_close(
            param.grad,
            expected,
            rtol=1e-4,
            atol=1e-5 * float(expected.abs().max()),
            msg=lambda m, name=name: f"{name}: {m}",
        )


def trl_trainer_state() -> dict:
    """What TRL's preference trainers' `_compute_loss` reads of a trainer beyond its settings
    (gradient checkpointing's arguments, the metrics it appends to, the token count it keeps),
    for a stub `self` of one process."""
    from collections import defaultdict
    from types import SimpleNamespace

    return {
        "args": SimpleNamespace(gradient_checkpointing_kwargs=None),
        "_metrics": {"train": defaultdict(list), "eval": defaultdict(list)},
        "_total_train_tokens": 0,
        "_tp_size": 1,
    }
