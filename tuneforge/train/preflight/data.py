"""The training and held-out data, read, tokenised (through the cache, which `train` then
reads) and packed as the objective reads them: records that are not valid, none left to train
on, pairs whose replies are the same, prompts a sampling objective cannot use."""

from tuneforge.config.errors import ConfigIssue
from tuneforge.errors import TuneforgeError
from tuneforge.train.preflight.check import Inputs
from tuneforge.train.preflight.mesh import mesh_issues


def data_issues(inputs: Inputs) -> list[ConfigIssue]:
    from tuneforge.train.build import load_data, read_training_data

    if inputs.tokenizer is None:
        return []  # the tokenizer check says why
    if mesh_issues(inputs):
        return []  # the ranks cannot be told which data to read; the mesh check says why
    try:
        if inputs.world is not None:  # the ranks share the tokenising
            inputs.data = load_data(inputs.config, inputs.tokenizer, inputs.world)
        else:
            inputs.data = read_training_data(inputs.config, inputs.tokenizer)
    except TuneforgeError as error:
        return [ConfigIssue(getattr(error, "field", "data.train"), str(error))]
    return []
