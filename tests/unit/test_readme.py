"""The README's configuration example is a valid configuration, as a newcomer would copy it."""

import re
import shutil
from pathlib import Path

from tests.helpers import save_tiny_llama
from tuneforge.assets import DEMO_DATA_DIR, DEMO_TOKENIZER_DIR
from tuneforge.config import load_config

README = Path(__file__).parents[2] / "README.md"


def test_the_readme_configuration_example_loads(tmp_path, monkeypatch):
    block = re.search(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert block is not None, "the README has no YAML example"
    model = tmp_path / "model"
    save_tiny_llama(model)
    for file in DEMO_TOKENIZER_DIR.iterdir():
        shutil.copy(file, model / file.name)
    monkeypatch.setenv("MODEL_DIR", str(model))
    monkeypatch.setenv("DATA", str(DEMO_DATA_DIR / "train.jsonl"))
    (tmp_path / "run.yaml").write_text(block.group(1))
    config = load_config(tmp_path / "run.yaml")
    assert config.lora.enabled and config.lora.rank == 16
    assert config.train.activation_checkpointing == "full"
