"""A tokenizer whose words are token ids: text written from ids tokenises back to exactly those
ids, so that a peer given text trains on the tokens tuneforge's side trains on."""

SPECIAL = ("<unk>", "<pad>", "<s>", "</s>")


def word_tokenizer(vocab_size: int, directory: str):
    """Word `t{i}` is token i (4 ≤ i < vocab_size), ids 0-3 the special tokens: text made of
    those words tokenises to exactly the ids it was written from."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL)}
    vocab |= {f"t{index}": index for index in range(len(SPECIAL), vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
    )
    fast.save_pretrained(directory)
    return fast
