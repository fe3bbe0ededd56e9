"""Name maps between our modules and each family's Hugging Face checkpoint layout.

One `StateDictAdapter` per `model_type`. Templates use `{i}` for the layer and `{j}` for the
expert: HF stores one matrix per expert, we stack them into a 3-D tensor indexed by `{j}`; a target
ending in `[0]` or `[1]` is the first or second half of each expert's rows (gate and up stacked in
`gate_up_proj`).
"""

import functools
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from tuneforge.models.args import (
    ModelArgs,
)
from tuneforge.models.errors import ModelError
from tuneforge.models.hf.config_fields import (
    deepseek_config,
    gemma_config,
    gemma_from_config,
    latent_from_config,
    moe_from_config,
    num_experts,
    rope_from_config,
    rope_parameters,
)

LLAMA_KEYS = {
    "model.embed_tokens.weight": "embed.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "layers.{i}.attn.q_proj.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "layers.{i}.attn.k_proj.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "layers.{i}.attn.v_proj.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "layers.{i}.attn.o_proj.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "layers.{i}.mlp.gate_proj.weight",
    "model.layers.{i}.mlp.up_proj.weight": "layers.{i}.mlp.up_proj.weight",
    "model.layers.{i}.mlp.down_proj.weight": "layers.{i}.mlp.down_proj.weight",
    "model.layers.{i}.input_layernorm.weight": "layers.{i}.attn_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "layers.{i}.mlp_norm.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}
QKV_BIAS_KEYS = {
    f"model.layers.{{i}}.self_attn.{p}_proj.bias": f"layers.{{i}}.attn.{p}_proj.bias" for p in "qkv"
}
QK_NORM_KEYS = {
    "model.layers.{i}.self_attn.q_norm.weight": "layers.{i}.attn.q_norm.weight",
    "model.layers.{i}.self_attn.k_norm.weight": "layers.{i}.attn.k_norm.weight",
}
MOE_KEYS = {
    "model.layers.{i}.mlp.gate.weight": "layers.{i}.mlp.router.weight",
    "model.layers.{i}.mlp.experts.{j}.gate_proj.weight": "layers.{i}.mlp.experts.gate_up_proj[0]",
    "model.layers.{i}.mlp.experts.{j}.up_proj.weight": "layers.{i}.mlp.experts.gate_up_proj[1]",
    "model.layers.{i}.mlp.experts.{j}.down_proj.weight": "layers.{i}.mlp.experts.down_proj",
}

MIXTRAL_KEYS = {
    "model.layers.{i}.block_sparse_moe.gate.weight": "layers.{i}.mlp.router.weight",
    "model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight": (
        "layers.{i}.mlp.experts.gate_up_proj[0]"
    ),
    "model.layers.{i}.block_sparse_moe.experts.{j}.w3.weight": (
        "layers.{i}.mlp.experts.gate_up_proj[1]"
    ),
    "model.layers.{i}.block_sparse_moe.experts.{j}.w2.weight": "layers.{i}.mlp.experts.down_proj",
}
"""Mixtral's checkpoint layout; transformers names the modules `mlp.gate` and `mlp.experts` once
loaded (`StateDictAdapter.renames`)."""
LATENT_ATTENTION_KEYS = {
    f"model.layers.{{i}}.self_attn.{name}.weight": f"layers.{{i}}.attn.{name}.weight"
    for name in (
        "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
        "kv_b_proj",
    )
}  # fmt: skip
GEMMA3_NORM_KEYS = {
    "model.layers.{i}.post_attention_layernorm.weight": "layers.{i}.attn_post_norm.weight",
    "model.layers.{i}.pre_feedforward_layernorm.weight": "layers.{i}.mlp_norm.weight",
    "model.layers.{i}.post_feedforward_layernorm.weight": "layers.{i}.mlp_post_norm.weight",
}
"""Gemma 3 normalises before and after attention and the MLP (Llama's `post_attention_layernorm`
is the MLP's input norm; Gemma's is the attention output's)."""
SHARED_EXPERT_KEYS = {
    f"model.layers.{{i}}.mlp.shared_experts.{p}_proj.weight": (
        f"layers.{{i}}.mlp.shared_experts.{p}_proj.weight"
    )
    for p in ("gate", "up", "down")
}


@functools.cache
def _pattern(template: str) -> re.Pattern[str]:
    escaped = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{j\}", r"(?P<j>\d+)")
    return re.compile("^" + escaped + "$")


def _split_half(template: str) -> tuple[str, int | None]:
    """`name[0]` -> (`name`, 0); a template without a half -> (template, None)."""
    if template.endswith(("[0]", "[1]")):
        return template[:-3], int(template[-2])
    return template, None


@dataclass(frozen=True)
class Place:
    """Where one HF tensor lives in ours: a parameter and, in a stacked bank, the expert and
    which half of its rows (0 or 1; None: all of them)."""

    name: str
    expert: int | None = None
    half: int | None = None

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        """The part of our parameter `tensor` that this place names (a view)."""
        part = tensor if self.expert is None else tensor[self.expert]
        return part if self.half is None else part.chunk(2, dim=0)[self.half]


def _translate(name: str, key_map: dict[str, str]) -> Place | None:
    """Map `name` through the first matching template; the expert index when `{j}` matched."""
    for source, target in key_map.items():
        match = _pattern(source).match(name)
        if match:
            groups = match.groupdict()
            target, half = _split_half(target)
            translated = target.replace("{i}", groups["i"]) if "i" in groups else target
            expert = int(groups["j"]) if "j" in groups else None
            return Place(translated, expert, half)
    return None


@dataclass(frozen=True)
class StateDictAdapter:
    """Translates parameter names and `config.json` for one model family."""

    model_type: str
    architecture: str
    key_map: dict[str, str]
    qkv_bias: bool = False
    qk_norm: bool = False
    extra_config: dict[str, Any] = field(default_factory=dict)
    windowed: bool = False
    """The config's `sliding_window` bounds every layer's attention (Mistral, Mixtral)."""
    renames: tuple[tuple[str, str], ...] = ()
    """(checkpoint, module) name parts where transformers' modules are not named as the
    checkpoint's tensors (adapters and PEFT name modules)."""
    config_style: str = "qwen"
    """How the config names what differs from Llama: `qwen` (experts as `num_experts`,
    `moe_intermediate_size`, ...), `mixtral` (`num_local_experts`, every layer sparse, experts as
    wide as `intermediate_size`, the top-k weights renormalised), `deepseek` (`n_routed_experts`,
    shared experts, the first `first_k_dense_replace` layers dense, latent attention) or `gemma`
    (Gemma 3's `layer_types`, rotary parameters per kind of layer, `query_pre_attn_scalar`)."""

    def from_hf(self, hf_name: str) -> Place | None:
        """Where a HF tensor goes in ours (None: not part of this family's layout)."""
        return _translate(hf_name, self.key_map)

    @functools.cached_property
    def _reverse_key_map(self) -> list[tuple[str, int | None, str]]:
        return [(*_split_half(ours), theirs) for theirs, ours in self.key_map.items()]

    def to_hf(self, name: str, expert: int | None = None, half: int | None = None) -> str | None:
        for ours, ours_half, theirs in self._reverse_key_map:
            match = _pattern(ours).match(name)
            if match and ours_half == half:
                hf_name = theirs.replace("{i}", match.groupdict().get("i", ""))
                return hf_name.replace("{j}", str(expert)) if expert is not None else hf_name
        return None

    def halves(self, name: str) -> tuple[int | None, ...]:
        """(0, 1) for a parameter stored as two HF tensors per expert, else (None,)."""
        found = tuple(
            half
            for ours, half, _ in self._reverse_key_map
            if half is not None and _pattern(ours).match(name)
        )
        return tuple(sorted(found)) or (None,)

    def module_to_hf(self, module_name: str) -> str:
        """HF name of one of our modules (e.g. `layers.0.attn.q_proj` -> `model.layers.0.self_attn.q_proj`)."""
        hf_name = self.to_hf(module_name + ".weight")
        if hf_name is None:
            raise KeyError(f"no Hugging Face name for module {module_name}")
        return self.runtime_name(hf_name.removesuffix(".weight"))

    def bank_to_hf(self, bank_name: str) -> str:
        """HF module name of one of our expert banks (`layers.0.mlp.experts` ->
        `model.layers.0.mlp.experts`), which transformers holds as one module."""
        first_expert = self.to_hf(f"{bank_name}.down_proj", expert=0)
        if first_expert is None:
            raise KeyError(f"no Hugging Face name for expert bank {bank_name}")
        return self.runtime_name(re.sub(r"\.0\.[^.]+\.weight$", "", first_expert))

    def runtime_name(self, checkpoint_name: str) -> str:
        """A checkpoint tensor's (or module's) name as transformers' loaded model has it."""
        for checkpoint, module in self.renames:
            checkpoint_name = checkpoint_name.replace(checkpoint, module)
        return checkpoint_name

    def args_from_config(self, config: dict[str, Any]) -> ModelArgs:
        num_heads = config["num_attention_heads"]
        rope_theta, rope_scaling = rope_from_config(config)
        gemma = None
        if self.config_style == "gemma":
            gemma, rope_theta, rope_scaling = gemma_from_config(config)
        return ModelArgs(
            vocab_size=config["vocab_size"],
            dim=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            ffn_dim=config["intermediate_size"],
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", self.qkv_bias)),
            qk_norm=self.qk_norm,
            moe=moe_from_config(config, self.config_style) if num_experts(config) else None,
            latent_attention=latent_from_config(config)
            if self.config_style == "deepseek"
            else None,
            max_position_embeddings=config.get("max_position_embeddings", 4096),
            sliding_window=config.get("sliding_window") if self.windowed else None,
            gemma=gemma,
            family=self.model_type,
        )

    def config_from_args(self, args: ModelArgs, dtype: str) -> dict[str, Any]:
        rope = rope_parameters(args.rope_theta, args.rope_scaling)
        config = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": args.vocab_size,
            "hidden_size": args.dim,
            "intermediate_size": args.ffn_dim,
            "num_hidden_layers": args.num_layers,
            "num_attention_heads": args.num_heads,
            "num_key_value_heads": args.num_kv_heads,
            "head_dim": args.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": args.norm_eps,
            "rope_theta": args.rope_theta,
            "rope_parameters": rope,
            "rope_scaling": rope if args.rope_scaling is not None else None,
            "max_position_embeddings": args.max_position_embeddings,
            "tie_word_embeddings": args.tie_embeddings,
            "attention_bias": args.attention_bias,
            "torch_dtype": dtype,
            **self.extra_config,
        }
        if self.windowed:
            config["sliding_window"] = args.sliding_window
        if self.config_style == "gemma":
            del config["hidden_act"], config["rope_scaling"]
            config |= gemma_config(args)
        if self.config_style == "deepseek":
            config |= deepseek_config(args)
            return config
        if args.moe is not None and self.config_style == "mixtral":
            config |= {
                "num_local_experts": args.moe.num_experts,
                "num_experts_per_tok": args.moe.top_k,
                "router_aux_loss_coef": args.moe.router_aux_loss_coef,
                "router_jitter_noise": 0.0,
            }
        elif args.moe is not None:
            moe = args.moe
            config |= {
                "num_experts": moe.num_experts,
                "num_experts_per_tok": moe.top_k,
                "moe_intermediate_size": moe.expert_ffn_dim,
                "norm_topk_prob": moe.norm_topk_prob,
                "router_aux_loss_coef": moe.router_aux_loss_coef,
                "decoder_sparse_step": moe.decoder_sparse_step,
                "mlp_only_layers": list(moe.mlp_only_layers),
            }
        return config


ADAPTERS = {
    "llama": StateDictAdapter(
        "llama", "LlamaForCausalLM", LLAMA_KEYS, extra_config={"mlp_bias": False}
    ),
    "qwen2": StateDictAdapter(
        "qwen2",
        "Qwen2ForCausalLM",
        LLAMA_KEYS | QKV_BIAS_KEYS,
        qkv_bias=True,
        extra_config={"use_sliding_window": False},
    ),
    "qwen3": StateDictAdapter(
        "qwen3", "Qwen3ForCausalLM", LLAMA_KEYS | QKV_BIAS_KEYS | QK_NORM_KEYS, qk_norm=True
    ),
    "qwen3_moe": StateDictAdapter(
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        LLAMA_KEYS | QKV_BIAS_KEYS | QK_NORM_KEYS | MOE_KEYS,
        qk_norm=True,
    ),
    "mistral": StateDictAdapter("mistral", "MistralForCausalLM", LLAMA_KEYS, windowed=True),
    "mixtral": StateDictAdapter(
        "mixtral",
        "MixtralForCausalLM",
        LLAMA_KEYS | MIXTRAL_KEYS,
        windowed=True,
        renames=((".block_sparse_moe.", ".mlp."),),
        config_style="mixtral",
    ),
    "gemma3_text": StateDictAdapter(
        "gemma3_text",
        "Gemma3ForCausalLM",
        LLAMA_KEYS | QK_NORM_KEYS | GEMMA3_NORM_KEYS,
        qk_norm=True,
        windowed=True,
        config_style="gemma",
    ),
    "deepseek_v2": StateDictAdapter(
        "deepseek_v2",
        "DeepseekV2ForCausalLM",
        LLAMA_KEYS | MOE_KEYS | LATENT_ATTENTION_KEYS | SHARED_EXPERT_KEYS,
        config_style="deepseek",
    ),
}


def adapter_for(model_type: str) -> StateDictAdapter:
    try:
        return ADAPTERS[model_type]
    except KeyError:
        known = ", ".join(sorted(ADAPTERS))
        raise ModelError(
            f"model_type '{model_type}' is not supported; supported: {known}"
        ) from None
