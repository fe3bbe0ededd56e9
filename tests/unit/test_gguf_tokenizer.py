"""A GGUF file tokenises as training did. For each family's kind of byte-level tokenizer, the ids
llama.cpp's rules give from what the GGUF file holds (the expressions its pre-tokenizer name
stands for in llama.cpp's `src/llama-vocab.cpp`, GPT-2's byte encoding, the file's merges and
its BOS setting) equal the tokenizer's own on a set of texts, special tokens among them."""

import itertools
import shutil

import gguf
import pytest
import regex
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tests.helpers import save_tiny_model
from tuneforge.assets import DEMO_TOKENIZER_DIR
from tuneforge.export.gguf_file import export_gguf
from tuneforge.export.sources import ExportError, resolve_source

LLAMA_CPP_EXPRESSIONS = {
    "llama-bpe": [
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    "qwen2": [
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    "gpt-2": [
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ],
    "deepseek-llm": [
        "[\r\n]",
        "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
        "\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+",
        "\\s+$",
        "[一-龥ࠀ-一가-\ud7ff]+",
        "\\p{N}+",
    ],
}
"""llama.cpp's expressions per pre-tokenizer name, copied from its src/llama-vocab.cpp."""
LLAMA_CPP_IGNORES_MERGES = {"llama-bpe"}

HF_SPLITS = {  # the expressions as the models' tokenizer.json files have them
    "llama-bpe": [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
    "qwen2": [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
    "gpt-2": [],
    "deepseek-llm": LLAMA_CPP_EXPRESSIONS["deepseek-llm"],
}
SPECIALS = {  # (special tokens, BOS or None, end of turn)
    "llama-bpe": (["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], "<|begin_of_text|>"),
    "qwen2": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None),
    "gpt-2": (["<|endoftext|>"], None),
    "deepseek-llm": (
        ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
        "<｜begin▁of▁sentence｜>",
    ),
}
FAMILIES = {  # what each family's models ship; Mistral's, Mixtral's and Gemma's are not byte-level
    "llama": "llama-bpe", "qwen2": "qwen2", "qwen3": "qwen2", "qwen3_moe": "qwen2",
    "deepseek_v2": "deepseek-llm", "mistral": "gpt-2", "mixtral": "gpt-2", "gemma3_text": "gpt-2",
}  # fmt: skip
CORPUS = [
    "sort: 7 3 9 1",
    "reverse: w i h",
    "add: 12 + 39 = 51",
    "It's what they'd've DONE, isn't it?",
    "Hello, world!  Two  spaces,\ttabs\n\nand new lines.\r\n",
    "x=1+22*333-4444/55555",
    "Ünïcödé café, naïve résumé: 東京 서울 ώ µ",
    "   leading and trailing   ",
    "end.\n",
]
TEXTS = [*CORPUS, "sorted: 1 2 3\n", "A 1234567 B", "don't  stop\n\n\nnow", " ", ""]


def build_tokenizer(kind: str, directory):
    specials, bos = SPECIALS[kind]
    tokenizer = Tokenizer(models.BPE(ignore_merges=kind in LLAMA_CPP_IGNORES_MERGES))
    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in HF_SPLITS[kind]]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=kind == "gpt-2")
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tokenizer.train_from_iterator(CORPUS * 3, trainer)
    if bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tokenizer.token_to_id(bos))]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=bos, eos_token=specials[-1], pad_token=specials[0]
    )
    fast.save_pretrained(str(directory))
    return AutoTokenizer.from_pretrained(str(directory))


def byte_encoder() -> dict[int, str]:
    """GPT-2's bytes-to-unicode table, as llama.cpp's unicode_byte_to_utf8."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


class LlamaCppTokenizer:
    """llama.cpp's BPE tokenisation, replayed from what a GGUF file holds."""

    def __init__(self, file):
        fields = gguf.GGUFReader(file).fields
        self.tokens = fields["tokenizer.ggml.tokens"].contents()
        self.ids = {token: index for index, token in enumerate(self.tokens)}
        types = fields["tokenizer.ggml.token_type"].contents()
        self.specials = sorted(
            (t for t, kind in zip(self.tokens, types, strict=True) if kind in (3, 4)),
            key=len, reverse=True,
        )  # fmt: skip
        merges = fields["tokenizer.ggml.merges"].contents()
        self.ranks = {tuple(merge.split(" ")): rank for rank, merge in enumerate(merges)}
        self.pre = fields["tokenizer.ggml.pre"].contents()
        add_bos = fields.get("tokenizer.ggml.add_bos_token")
        self.add_bos = add_bos.contents() if add_bos is not None else self.pre == "llama-bpe"
        bos = fields.get("tokenizer.ggml.bos_token_id")
        self.bos = bos.contents() if bos is not None else 11  # llama.cpp's default BPE id
        self.bytes = byte_encoder()

    def split(self, text: str) -> list[str]:
        pieces = [text]
        for expression in LLAMA_CPP_EXPRESSIONS[self.pre]:
            pattern, found = regex.compile(expression), []
            for piece in pieces:
                start = 0
                for match in pattern.finditer(piece):
                    if match.start() > start:
                        found.append(piece[start : match.start()])
                    if match.end() > match.start():
                        found.append(match.group())
                    start = match.end()
                if start < len(piece):
                    found.append(piece[start:])
            pieces = found
        return pieces

    def bpe(self, piece: str) -> list[int]:
        word = "".join(self.bytes[b] for b in piece.encode("utf-8"))
        if self.pre in LLAMA_CPP_IGNORES_MERGES and word in self.ids:
            return [self.ids[word]]
        symbols = list(word)
        while len(symbols) > 1:
            pairs = [
                (self.ranks.get(pair, 1 << 30), i)
                for i, pair in enumerate(itertools.pairwise(symbols))
            ]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        return [self.ids[symbol] for symbol in symbols]

    def __call__(self, text: str, add_special: bool) -> list[int]:
        ids = [self.bos] if add_special and self.add_bos else []
        parts = regex.split("(" + "|".join(map(regex.escape, self.specials)) + ")", text)
        for part in parts:
            if part in self.ids and part in self.specials:
                ids.append(self.ids[part])
            elif part:
                ids += [i for piece in self.split(part) for i in self.bpe(piece)]
        return ids


def export(tmp_path, family, tokenizer_dir=None, kind=None):
    base = tmp_path / "base"
    if tokenizer_dir is None:
        tokenizer = build_tokenizer(kind, base)
    else:
        shutil.copytree(tokenizer_dir, base)
        tokenizer = AutoTokenizer.from_pretrained(str(base))
    save_tiny_model(base, family, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    export_gguf(resolve_source(base), tmp_path / "model.gguf")
    return tokenizer, LlamaCppTokenizer(tmp_path / "model.gguf")


def check_ids(tokenizer, llama_cpp, specials):
    for text in TEXTS:
        assert llama_cpp(text, add_special=True) == tokenizer(text)["input_ids"], repr(text)
    for text in TEXTS:  # as training tokenises a rendered conversation: specials in the text
        rendered = f"{specials[0]}{text}{specials[-1]}\n{specials[-1]}"
        expected = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        assert llama_cpp(rendered, add_special=False) == expected, repr(rendered)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_familys_tokenizer_tokenises_in_llama_cpp_as_in_training(tmp_path, family):
    kind = FAMILIES[family]
    tokenizer, llama_cpp = export(tmp_path, family, kind=kind)
    assert llama_cpp.pre == kind
    assert llama_cpp.add_bos == (SPECIALS[kind][1] is not None)
    if SPECIALS[kind][1] is not None:
        assert llama_cpp.bos == tokenizer.bos_token_id
    check_ids(tokenizer, llama_cpp, SPECIALS[kind][0])


def test_the_demo_tokenizer_tokenises_in_llama_cpp_as_in_training(tmp_path):
    tokenizer, llama_cpp = export(tmp_path, "llama", DEMO_TOKENIZER_DIR)
    assert llama_cpp.pre == "llama-bpe" and llama_cpp.add_bos is False
    check_ids(tokenizer, llama_cpp, ["<|im_start|>", "<|im_end|>"])
    assert tokenizer.convert_ids_to_tokens(llama_cpp("sort: 7 3 9 1", False))[:2] == ["sort", ":"]


@pytest.mark.parametrize(
    ("pre_tokenizer", "said"),
    [
        ([pre_tokenizers.Split(" ", behavior="isolated")], "a split on ' ', Isolated"),
        ([pre_tokenizers.Split(Regex(r"\p{N}+"), behavior="isolated")], "its split expressions"),
        ([pre_tokenizers.Digits(individual_digits=True)], "a Digits pre-tokenizer"),
    ],
)
def test_a_tokenizer_llama_cpp_cannot_replay_is_refused_before_writing(
    tmp_path, pre_tokenizer, said
):
    base = tmp_path / "base"
    build_tokenizer("qwen2", base)
    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*pre_tokenizer, byte_level])
    tokenizer.save(str(base / "tokenizer.json"))
    save_tiny_model(base, "qwen2", vocab_size=420, eos_token_id=2)
    with pytest.raises(ExportError, match=regex.escape(said) + ".*tokenise differently"):
        export_gguf(resolve_source(base), tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]
