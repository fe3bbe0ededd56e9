import pytest

from tests.helpers import tiny_decoder as tiny
from tuneforge.errors import TuneforgeError
from tuneforge.execution.host_embedding import embedding_to_host


def test_only_a_frozen_untied_embedding_of_one_process_goes_to_the_host():
    model = tiny(tied=False)
    with pytest.raises(TuneforgeError, match=r"train\.offload_embedding: the embedding trains"):
        embedding_to_host(model, 1)
    model.embed.weight.requires_grad_(False)
    with pytest.raises(TuneforgeError, match="one process"):
        embedding_to_host(model, 2)
    embedding_to_host(model, 1)  # on a CPU-only machine it is already there
    assert model.embed.weight.device.type == "cpu"
    tied = tiny(tied=True)
    tied.embed.weight.requires_grad_(False)
    with pytest.raises(TuneforgeError, match="shares the embedding"):
        embedding_to_host(tied, 1)
