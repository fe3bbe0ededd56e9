"""Our F16 GGUF against the one llama.cpp's own `convert_hf_to_gguf.py` writes for the same model,
for every family: the same tensors bit for bit, and every metadata field the converter writes with
the same value. The converter comes with llama.cpp's source tree (also inside llama-cpp-python's
source distribution, under `vendor/llama.cpp`): point `TUNEFORGE_LLAMA_CPP` at it, with
`sentencepiece` installed; without them the test skips."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from tests.helpers import save_tiny_model
from tuneforge.assets import DEMO_TOKENIZER_DIR
from tuneforge.export.gguf_families import ARCHITECTURES
from tuneforge.export.gguf_file import export_gguf
from tuneforge.export.gguf_tokenizer import pre_tokenizer_name, read_byte_level_bpe
from tuneforge.export.sources import resolve_source

gguf = pytest.importorskip("gguf")
VOCAB = len(AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR))
LLAMA_CPP = Path(os.environ.get("TUNEFORGE_LLAMA_CPP", "/nonexistent"))
CONVERTER = LLAMA_CPP / "convert_hf_to_gguf.py"
pytestmark = pytest.mark.skipif(
    not CONVERTER.is_file(),
    reason="set TUNEFORGE_LLAMA_CPP to a llama.cpp source tree to compare with its converter",
)

# The converter names a byte-level BPE pre-tokenizer by hashing how a known model's tokenizer
# splits a probe text; the tiny demo tokenizer is no known model's, so it is told the name that
# tuneforge writes for it (the vocabulary, merges and special ids are still its own).
DRIVER = """
import runpy, sys
from pathlib import Path
script, pre, *args = sys.argv[1:]
sys.path[:0] = [str(Path(script).parent), str(Path(script).parent / "gguf-py")]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
"""

# Fields we write beyond the converter's, each llama.cpp's own key with the model's value.
OUR_EXTRAS = {
    "attention.key_length",
    "attention.value_length",
    "rope.dimension_count",
    "vocab_size",
    "expert_feed_forward_length",
}


def read(file: Path) -> tuple[dict, dict]:
    reader = gguf.GGUFReader(file)
    tensors = {t.name: (t.tensor_type, np.asarray(t.data).copy()) for t in reader.tensors}
    fields = {
        name: field.contents()
        for name, field in reader.fields.items()
        if not name.startswith(("GGUF.", "general."))  # file layout; name and size labels
    }
    return tensors, fields


@pytest.mark.parametrize(
    "family",
    ["llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "mixtral", "gemma3_text", "deepseek_v2"],
)
def test_f16_gguf_equals_llama_cpp_converters(tmp_path, family):
    pytest.importorskip("sentencepiece")  # the converter imports it for any Llama-family vocab
    base = tmp_path / "base"
    save_tiny_model(base, family, vocab_size=VOCAB, eos_token_id=0)
    for file in DEMO_TOKENIZER_DIR.iterdir():
        shutil.copy(file, base / file.name)
    export_gguf(resolve_source(base), tmp_path / "ours.gguf", "f16")
    theirs = tmp_path / "theirs.gguf"
    pre = pre_tokenizer_name(read_byte_level_bpe(base), base)
    command = [sys.executable, "-c", DRIVER, str(CONVERTER), pre, str(base)]
    run = subprocess.run(
        [*command, "--outtype", "f16", "--outfile", str(theirs)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    our_tensors, our_fields = read(tmp_path / "ours.gguf")
    their_tensors, their_fields = read(theirs)
    assert set(our_tensors) == set(their_tensors)
    for name, (kind, data) in their_tensors.items():
        assert our_tensors[name][0] == kind, name
        np.testing.assert_array_equal(our_tensors[name][1], data, err_msg=name)
    for key, value in their_fields.items():
        assert our_fields.get(key) == value, key
    arch = ARCHITECTURES[family]
    extras = our_fields.keys() - their_fields.keys()
    # the tokenizer's own BOS and EOS behaviour, where a config file that does not say leaves
    # llama.cpp to its per-pre-tokenizer defaults
    ours = {
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
    }
    assert extras <= {f"{arch}.{key}" for key in OUR_EXTRAS} | ours
