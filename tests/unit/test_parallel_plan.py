"""The pieces of chapter 16 that need no second process: shard plans, the selector, experts split across ranks,
the settings and the torchrun environment."""
import dataclasses

import pytest
import torch

from helios.config import EngineConfig
from helios.distributed.groups import ParallelLayout
from helios.distributed.launch import _check_world, rank_env
from helios.distributed.shard import LocalExperts, plan_shard, tensor_selector
from helios.llm import local_launch
from helios.model.moe import Experts, MoEConfig, MoEModelConfig, Router
from helios.registry import NotApplicable

MOE = MoEModelConfig("qwen3_moe", vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=4, num_heads=4,
                     num_kv_heads=2, head_dim=8, moe=MoEConfig(7, 2, 16, (0, 2, 3)))


def test_experts_split_over_ranks_add_up_to_all_experts():
    torch.manual_seed(0)
    experts, router = Experts(7, 32, 16), Router(MOE.moe, 32)
    x = torch.randn(10, 32)
    routing = router(x)
    parts, cfg = [], dataclasses.replace(MOE, num_heads=6, num_kv_heads=3)  # heads three ranks divide
    for rank in range(3):  # 7 experts over 3 ranks: 3, 2, 2
        ids = plan_shard(cfg, ParallelLayout(tp=3, pp=1, rank=rank)).experts
        local = LocalExperts(ids, 32, 16)
        local.gate_up_proj.data, local.down_proj.data = experts.gate_up_proj.data[ids.start:ids.stop], experts.down_proj.data[ids.start:ids.stop]
        parts.append(local(x, routing))
    assert [len(plan_shard(cfg, ParallelLayout(3, 1, r)).experts) for r in range(3)] == [3, 2, 2]
    torch.testing.assert_close(sum(parts), experts(x, routing), rtol=1e-5, atol=1e-6)


def test_the_selector_keeps_only_this_ranks_experts_and_stage():
    shard = plan_shard(MOE, ParallelLayout(tp=2, pp=2, rank=3))  # stage 1 (layers 2, 3), experts 4..6
    select = tensor_selector(MOE, shard)
    assert select("model.layers.1.mlp.experts.5.up_proj.weight", (16, 32)) is None        # stage 0's layer
    assert select("model.layers.2.mlp.experts.3.up_proj.weight", (16, 32)) is None        # rank 2's expert
    assert select("model.layers.2.mlp.experts.4.up_proj.weight", (16, 32)) == (slice(None),)
    assert select("model.layers.3.mlp.experts.gate_up_proj", (7, 32, 32)) == (slice(4, 7),)  # stacked: dim 0
    assert select("model.layers.3.mlp.gate.weight", (7, 32)) == (slice(None),)             # the router, whole
    assert select("lm_head.weight", (300, 32)) == (slice(150, 300),)
    with pytest.raises(ValueError, match="no rule says how to split 'model.layers.2.mlp.mystery.weight'"):
        select("model.layers.2.mlp.mystery.weight", (4, 4))


def test_sizes_that_cannot_be_split_say_which():
    with pytest.raises(ValueError, match="tensor_parallel_size=8 is more than the 7 experts"):
        plan_shard(dataclasses.replace(MOE, num_heads=8, num_kv_heads=8), ParallelLayout(8, 1, 0))
    with pytest.raises(ValueError, match="tensor_parallel_size=4 and the 6 KV heads: one must divide the other"):
        plan_shard(dataclasses.replace(MOE, num_heads=12, num_kv_heads=6), ParallelLayout(4, 1, 0))
    with pytest.raises(ValueError, match="pipeline_parallel_size=5 is more than the model's 4 layers"):
        plan_shard(MOE, ParallelLayout(1, 5, 0))


def test_settings_the_environment_and_the_executors():
    config = EngineConfig.from_env({"HELIOS_TENSOR_PARALLEL_SIZE": "2", "HELIOS_PIPELINE_PARALLEL_SIZE": "3"})
    assert (config.tensor_parallel_size, config.pipeline_parallel_size, config.world_size) == (2, 3, 6)
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="executor must be one of auto, local, multiprocess"):
        EngineConfig(executor="threads")
    with pytest.raises(NotApplicable, match="the local executor runs one process; 6 ranks need 'multiprocess'"):
        local_launch(None, "auto", "cpu", config)
    env = rank_env({"RANK": "1", "WORLD_SIZE": "6", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29501"})
    assert env == (1, 6, 1, "10.0.0.1", 29501) and rank_env({}) is None
    _check_world(config, env)
    with pytest.raises(ValueError, match="WORLD_SIZE=4 but tensor_parallel_size x pipeline_parallel_size = 2 x 3 = 6"):
        _check_world(config, env._replace(world=4))
