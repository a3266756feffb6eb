"""Expert parallelism on torch.distributed: N ranks (launched by torchrun), each holding the
resident weights and a shard of every MoE layer's routed experts; one collective per MoE layer.

    ep = ExpertParallel.from_env(replicate_hot=0)      # RANK, WORLD_SIZE, MASTER_ADDR/PORT (torchrun's)
    model = strata.load(path, expert_parallel=ep)      # refuses ranks started on other files
"""
from .group import ExpertParallel
from .plan import ShardPlan, file_checksum, shard_plan

__all__ = ["ExpertParallel", "ShardPlan", "file_checksum", "shard_plan"]
