"""Synthetic training batches: documents of log-normal lengths packed into exactly the step's
tokens (what a packed real dataset gives), or one document filling it (what the peers see); for
preference training, pairs whose two documents share a prompt, the same for every system."""

import numpy as np
import torch

from tuneforge.data.packing import IGNORE_INDEX, PackedBatch
from tuneforge.packed import PackedSequences

MEDIAN_DOC_TOKENS = 600
SIGMA = 0.9


def document_lengths(tokens: int, rng: np.random.Generator) -> list[int]:
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(int(np.clip(rng.lognormal(np.log(MEDIAN_DOC_TOKENS), SIGMA), 16, tokens)))
    lengths[-1] -= sum(lengths) - tokens  # the last document is cut to fill the step
    return [length for length in lengths if length > 0]


def batch_lengths(tokens: int, one_document: bool, seed: int) -> list[int]:
    """The document lengths of `synthetic_batch`'s batch of this seed."""
    return [tokens] if one_document else document_lengths(tokens, np.random.default_rng(seed))


def synthetic_batch(vocab_size: int, tokens: int, one_document: bool, seed: int) -> PackedBatch:
    rng = np.random.default_rng(seed)
    lengths = [tokens] if one_document else document_lengths(tokens, rng)
    ids = rng.integers(0, vocab_size, tokens)
    labels = np.roll(ids, -1)
    labels[np.cumsum(lengths) - 1] = IGNORE_INDEX  # no target across a document's end
    return PackedBatch(
        torch.from_numpy(ids),
        torch.from_numpy(labels),
        PackedSequences.from_lengths(lengths),
        int((labels != IGNORE_INDEX).sum()),
    )


PAIR_PROMPT_SHARES = (0.25, 0.5, 0.75, 0.125)
"""Each distinct pair's prompt as a share of its documents' length: the pairs cycled through."""


PAIR_EOS = 3
"""The end-of-sequence id of the peer's word tokenizer (`peers._save_word_tokenizer`)."""


def pair_shape(tokens: int, index: int) -> tuple[int, int]:
    """(prompt, reply) tokens of pair `index` filling a step of `tokens`: chosen and rejected
    replies of equal length, so no system pads one to the other."""
    document = tokens // 2
    prompt = int(document * PAIR_PROMPT_SHARES[index % len(PAIR_PROMPT_SHARES)])
    return prompt, document - prompt


def pair_token_ids(vocab_size: int, tokens: int, index: int) -> tuple[list, list, list]:
    """Pair `index`'s (prompt, chosen, rejected) token ids: words from id 4 on (a peer's
    tokenizer keeps 0-3 for its special tokens), each reply ending with `PAIR_EOS`."""
    prompt, reply = pair_shape(tokens, index)
    rng = np.random.default_rng(1000 + index)
    ids = rng.integers(4, vocab_size, prompt + 2 * reply).tolist()
    chosen, rejected = ids[prompt : prompt + reply], ids[prompt + reply :]
    return ids[:prompt], [*chosen[:-1], PAIR_EOS], [*rejected[:-1], PAIR_EOS]


def synthetic_pair(vocab_size: int, tokens: int, index: int) -> PackedBatch:
    """Pair `index` as a preference micro-batch: prompt + chosen, then prompt + rejected, each
    supervised on its reply only."""
    prompt, chosen, rejected = pair_token_ids(vocab_size, tokens, index)
    ids, labels = [], []
    for reply in (chosen, rejected):
        document = prompt + reply
        targets = [IGNORE_INDEX] * (len(prompt) - 1) + reply + [IGNORE_INDEX]
        ids += document
        labels += targets
    return packed_batch(ids, labels, [len(prompt) + len(chosen), len(prompt) + len(rejected)])


def packed_batch(ids: list[int], labels: list[int], lengths: list[int]) -> PackedBatch:
    label_tensor = torch.tensor(labels)
    return PackedBatch(
        torch.tensor(ids),
        label_tensor,
        PackedSequences.from_lengths(lengths),
        int((label_tensor != IGNORE_INDEX).sum()),
    )


def prompt_token_ids(vocab_size: int, tokens: int, index: int) -> list[int]:
    """Prompt `index` of `tokens` words from id 4 on (a peer's tokenizer keeps 0-3)."""
    return np.random.default_rng(5000 + index).integers(4, vocab_size, tokens).tolist()


def synthetic_prompts(vocab_size: int, prompts: int, tokens: int, first: int) -> PackedBatch:
    """Prompts `first` .. `first + prompts - 1` as a GRPO objective reads them: each a document
    of the prompt and one supervised answer token (`PAIR_EOS`), which the rollout cuts off."""
    ids, labels, lengths = [], [], []
    for index in range(first, first + prompts):
        prompt = prompt_token_ids(vocab_size, tokens, index)
        ids += [*prompt, PAIR_EOS]
        labels += [IGNORE_INDEX] * (tokens - 1) + [PAIR_EOS, IGNORE_INDEX]
        lengths.append(tokens + 1)
    return packed_batch(ids, labels, lengths)
