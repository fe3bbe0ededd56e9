"""The tokenizer inside a GGUF file. llama.cpp does not read a tokenizer's pre-tokenizer: it
splits text by rules of its own, named by `tokenizer.ggml.pre`. The name is chosen here by what
the tokenizer does, its pre-tokenizer's splits (as llama.cpp's converter chooses it by the
tokenizer's identity); a tokenizer whose splits llama.cpp has no rules for is refused, since its
GGUF file would tokenise differently from training. BOS is written as the tokenizer adds it."""

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gguf

from tuneforge.export.generation import end_of_turn_id
from tuneforge.export.sources import ExportError

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEEPSEEK_LLM_SPLITS = (
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-\ud7ff]+",
    "\\p{N}+",
)


SplitKey = tuple[tuple[str, ...], bool, bool]
"""A tokenizer's splits as llama.cpp could replay them: its regular expressions (each isolating
its matches, CR and LF written escaped), whether byte-level encoding splits by GPT-2's own
expression, and whether a piece found whole in the vocabulary skips the merges."""


def _escaped(pattern: str) -> str:
    """tokenizer.json files write CR and LF in a pattern either escaped or as characters."""
    return pattern.replace("\r", "\\r").replace("\n", "\\n")


KNOWN: dict[SplitKey, str] = {
    ((_escaped(LLAMA3_SPLIT),), False, True): "llama-bpe",
    ((_escaped(QWEN2_SPLIT),), False, False): "qwen2",
    ((), True, False): "gpt-2",
    (tuple(map(_escaped, DEEPSEEK_LLM_SPLITS)), False, False): "deepseek-llm",
}
"""llama.cpp's name for each way of splitting it has rules for (Llama 3; Qwen2 and Qwen3;
GPT-2; DeepSeek LLM and DeepSeek-V2)."""


def split_key(spec: dict[str, Any]) -> SplitKey | str:
    """A tokenizer.json's splits, or what in them llama.cpp cannot replay."""
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    patterns, gpt2_regex = [], False
    for step in steps:
        kind, pattern = step.get("type"), step.get("pattern") or {}
        if kind == "Split" and "Regex" in pattern and step.get("behavior") == "Isolated":
            if step.get("invert"):
                return "an inverted split"
            patterns.append(_escaped(pattern["Regex"]))
        elif kind == "ByteLevel" and not step.get("add_prefix_space"):
            gpt2_regex = bool(step.get("use_regex", True))
        elif kind == "Split":
            split_on = pattern.get("String", pattern.get("Regex"))
            return f"a split on {split_on!r}, {step.get('behavior')}"
        else:
            return f"a {kind} pre-tokenizer" if kind else "no pre-tokenizer"
    ignore_merges = bool((spec.get("model") or {}).get("ignore_merges"))
    return tuple(patterns), gpt2_regex, ignore_merges


def pre_tokenizer_name(spec: dict[str, Any], tokenizer_dir: Path) -> str:
    """llama.cpp's `tokenizer.ggml.pre` for a tokenizer.json, or a refusal that says why."""
    key = split_key(spec)
    if isinstance(key, tuple) and key in KNOWN:
        return KNOWN[key]
    if isinstance(key, str):
        what = key
    elif any(known[:2] == key[:2] for known in KNOWN):
        what = f"its merges with ignore_merges={key[2]}, unlike the tokenizers that split so"
    else:
        what = "its split expressions" if key[0] else "its byte-level split"
    raise ExportError(
        f"{tokenizer_dir}/tokenizer.json: llama.cpp has no pre-tokenizer that splits text as this "
        f"tokenizer does ({what}), so a GGUF file would tokenise differently from training. "
        "GGUF export knows the splits of the Llama 3, Qwen2/Qwen3, GPT-2 and DeepSeek LLM/V2 "
        "tokenizers; for another, use the merged model (tuneforge export merge) where it runs"
    )


def adds_token(tokenizer, token_id: int | None, first: bool) -> bool:
    """Whether the tokenizer puts `token_id` first (or last) when asked for special tokens."""
    if token_id is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0 if first else -1] == token_id


def vocabulary(tokenizer, vocab_size: int) -> tuple[list[str], list["gguf.TokenType"]]:
    """Tokens by id and their GGUF types, as llama.cpp's converter lists a BPE vocabulary."""
    import gguf

    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for index in range(vocab_size):
        if index not in by_id:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
        elif index in added:
            tokens.append(by_id[index])
            types.append(
                gguf.TokenType.CONTROL if added[index].special else gguf.TokenType.USER_DEFINED
            )
        else:
            tokens.append(by_id[index])
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def read_byte_level_bpe(tokenizer_dir: Path) -> dict[str, Any]:
    """tokenizer.json of a byte-level BPE tokenizer, the only kind a GGUF file embeds here."""
    file = tokenizer_dir / "tokenizer.json"
    spec = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    model_type = (spec.get("model") or {}).get("type")
    byte_level = "ByteLevel" in json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
    if model_type != "BPE" or not byte_level:
        kind = "SentencePiece-style BPE" if model_type == "BPE" else model_type
        raise ExportError(
            f"{tokenizer_dir}: GGUF export embeds byte-level BPE tokenizers (Llama 3, Qwen); "
            f"this tokenizer is {kind or 'not a tokenizer.json'}: merge the model (tuneforge "
            "export merge) and convert it with llama.cpp's convert_hf_to_gguf.py"
        )
    return spec


def add_tokenizer(writer, tokenizer, tokenizer_dir: Path, vocab_size: int) -> None:
    """Tokens, types, merges, special ids, whether BOS and EOS are added, the end-of-turn id
    and the chat template."""
    import gguf

    spec = read_byte_level_bpe(tokenizer_dir)
    tokens, types = vocabulary(tokenizer, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer_name(spec, tokenizer_dir))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(tokenizer_dir, load_merges=True, n_vocab=vocab_size)
    # what the tokenizer does, not what a config file claims: llama.cpp defaults BOS on for
    # some pre-tokenizers, with a default id that may be any token of this vocabulary
    special.add_special_token["bos"] = adds_token(tokenizer, tokenizer.bos_token_id, first=True)
    special.add_special_token["eos"] = adds_token(tokenizer, tokenizer.eos_token_id, first=False)
    if tokenizer.bos_token_id is not None:
        special.special_token_ids["bos"] = tokenizer.bos_token_id
    special.add_to_gguf(writer, quiet=True)
    if tokenizer.chat_template and special.chat_template is None:
        writer.add_chat_template(tokenizer.chat_template)
    end_of_turn = end_of_turn_id(tokenizer)
    if end_of_turn is not None:
        writer.add_eot_token_id(end_of_turn)
