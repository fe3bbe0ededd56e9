"""The run's tokenizer: it loads, has a chat template, and its tokens fit the model's
vocabulary (the model's config.json)."""

from tuneforge.config.errors import ConfigIssue
from tuneforge.train.preflight.check import Inputs


def tokenizer_issues(inputs: Inputs) -> list[ConfigIssue]:
    if inputs.tokenizer is None:
        assert inputs.tokenizer_problem is not None
        field = "tokenizer.path" if inputs.config.tokenizer.path is not None else "model.path"
        return [ConfigIssue(field, inputs.tokenizer_problem)]
    vocabulary = inputs.model_args.vocab_size
    if len(inputs.tokenizer) > vocabulary:
        return [
            ConfigIssue(
                "tokenizer.path",
                f"the tokenizer has {len(inputs.tokenizer)} tokens but the model's vocabulary "
                f"holds {vocabulary}",
                "use the model's own tokenizer",
            )
        ]
    return []
