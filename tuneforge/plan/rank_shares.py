"""The parameters one rank holds under a device-mesh layout: tensor parallelism splits the
attention's and the dense MLPs' projections (`parallel.tensor_parallel` ranks), expert
parallelism the routed experts (`parallel.expert_parallel`); the norms, the routers, the shared
experts, the embedding and the output layer stay whole. FSDP2 then shards the rest over the
data-parallel ranks of a replica group, and each rank's experts over the ranks that hold the
same ones."""

from dataclasses import dataclass

from tuneforge.models.args import ModelArgs


@dataclass(frozen=True)
class RankShares:
    dense: float
    """Parameters of one rank's tensor-parallel share, routed experts aside."""
    routed: float
    """Routed experts' parameters of one rank's expert-parallel share."""
    dense_shards: int = 1
    """Ranks FSDP2 shards the dense parameters over (1: not sharded)."""
    routed_shards: int = 1

    def sharded(self) -> float:
        """Parameters a rank keeps of its shares once FSDP2 has sharded them."""
        return self.dense / self.dense_shards + self.routed / self.routed_shards

    def whole(self) -> float:
        """Parameters a rank uses: its shares gathered."""
        return self.dense + self.routed


def rank_shares(
    args: ModelArgs, tensor: int = 1, expert: int = 1, dense_shards: int = 1, routed_shards: int = 1
) -> RankShares:
    dense = float(args.vocab_size * args.dim * (1 if args.tie_embeddings else 2) + args.dim)
    routed = 0.0
    head_norms = 2 * args.head_dim if args.qk_norm else 0
    for layer in range(args.num_layers):
        dense += (args.attention_params() - head_norms) / tensor + head_norms
        dense += args.norms * args.dim
        if args.moe is not None and args.is_sparse_layer(layer):
            moe = args.moe
            routed += moe.num_experts * 3 * args.dim * moe.expert_ffn_dim / expert
            dense += moe.num_experts * args.dim  # the router
            dense += moe.shared_experts * 3 * args.dim * moe.expert_ffn_dim
        else:
            dense += 3 * args.dim * args.ffn_dim / tensor
    return RankShares(dense, routed, dense_shards, routed_shards)
