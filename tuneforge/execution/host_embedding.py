"""The frozen input embedding kept in pinned host memory.

A LoRA run never changes the input embedding and reads only the rows of the step's tokens, a
small share of a large vocabulary. Kept on the host, each micro-batch's rows ([tokens, dim])
are gathered there and copied to the GPU, without the host waiting for it. The batch's token ids then stay on the host too
(`Decoder.hidden_states` gathers where the embedding is).
"""

from tuneforge.errors import TuneforgeError
from tuneforge.models.decoder import Decoder

WHERE = "train.offload_embedding"


def embedding_to_host(model: Decoder, world_size: int) -> None:
    """Move `model`'s input embedding to pinned host memory (a no-op when it is there)."""
    weight = model.embed.weight
    if model.args.tie_embeddings:
        raise TuneforgeError(
            f"{WHERE}: this model's output layer shares the embedding, which the GPU needs for "
            "the loss: drop it"
        )
    if weight.requires_grad:
        raise TuneforgeError(
            f"{WHERE}: the embedding trains in this run; it stays on the host only when frozen "
            "(a LoRA run): drop it"
        )
    if world_size > 1:
        raise TuneforgeError(f"{WHERE} runs on one process; drop it with DDP or FSDP")
    if weight.device.type == "cuda":
        weight.data = weight.data.cpu().pin_memory()
