"""Cached generation against transformers' `generate` and against recomputing the whole sequence."""

import pytest
import torch

import tuneforge
from tests.helpers import save_tiny_model
from tuneforge.models.generate import generate

PROMPTS = [[5, 9, 17, 3], [44], [7, 7, 7, 1, 2, 90, 33, 12, 4]]


@pytest.mark.parametrize(
    "family", ["llama", "qwen3", "mistral", "mixtral", "deepseek_v2", "gemma3_text"]
)
def test_greedy_generation_matches_transformers(tmp_path, family):
    hf_model = save_tiny_model(tmp_path, family)
    model = tuneforge.load_model(tmp_path, dtype="float32", attention="sdpa")
    ours = generate(model, PROMPTS, max_new_tokens=12, stop_ids=set())
    for prompt, reply in zip(PROMPTS, ours, strict=True):
        expected = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        assert reply == expected


def test_cache_equals_recomputing_and_stops_at_stop_tokens(tmp_path):
    save_tiny_model(tmp_path, "qwen3_moe")
    model = tuneforge.load_model(tmp_path, dtype="float32", attention="sdpa")
    replies = generate(model, PROMPTS, max_new_tokens=8, stop_ids=set())
    for prompt, reply in zip(PROMPTS, replies, strict=True):
        sequence = list(prompt)
        for _ in range(8):
            with torch.no_grad():
                sequence.append(int(model(torch.tensor([sequence]))[0, -1].argmax()))
        assert reply == sequence[len(prompt) :]
    stop = replies[0][3]
    stopped = generate(model, PROMPTS[:1], max_new_tokens=8, stop_ids={stop})
    assert stopped[0] == replies[0][: replies[0].index(stop)]


def test_sampling_is_seeded(tmp_path):
    save_tiny_model(tmp_path, "llama")
    model = tuneforge.load_model(tmp_path, dtype="float32")
    first = generate(
        model, PROMPTS, 10, set(), temperature=1.0, generator=torch.Generator().manual_seed(1)
    )
    again = generate(
        model, PROMPTS, 10, set(), temperature=1.0, generator=torch.Generator().manual_seed(1)
    )
    greedy = generate(model, PROMPTS, 10, set())
    assert first == again and first != greedy
    # top-k 1 leaves one token to draw: sampling is then greedy, whatever the seed
    top_1 = generate(
        model, PROMPTS, 10, set(), 1.0, torch.Generator().manual_seed(1), top_p=1.0, top_k=1
    )
    assert top_1 == greedy


def test_a_shared_prompt_cache_samples_what_repeated_prompts_sample(tmp_path):
    """`copies`: each prompt prefilled once, its cache repeated for its replies; the replies are
    those of the prompts written out that many times, draw for draw, stop tokens included."""
    save_tiny_model(tmp_path, "llama")
    model = tuneforge.load_model(tmp_path, dtype="float32", attention="sdpa")
    repeated = [prompt for prompt in PROMPTS for _ in range(4)]
    written_out = generate(
        model, repeated, 10, {7}, 1.0, torch.Generator().manual_seed(3), keep_stop=True
    )
    shared = generate(
        model, PROMPTS, 10, {7}, 1.0, torch.Generator().manual_seed(3), keep_stop=True, copies=4
    )
    assert shared == written_out
    assert len({tuple(reply) for reply in shared[:4]}) > 1  # a group's replies differ
    assert any(reply and reply[-1] == 7 for reply in shared)  # the stop token kept
