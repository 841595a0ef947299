"""The environment each worker starts with: torchrun's variables on top of the plan's base."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from launcher.plan import LaunchPlan
    from launcher.rendezvous.api import RendezvousInfo

__all__ = ["worker_environment"]


def worker_environment(
    plan: LaunchPlan,
    info: RendezvousInfo,
    slot_ranks: tuple[int, int, int],
    world: tuple[int, int],
    restart_count: int,
) -> dict[str, str]:
    """The environment one worker gets: exactly torchrun's variables on top of the agent's."""
    local_rank, global_rank, role_rank = slot_ranks
    world_size, role_world_size = world
    base_env = plan.workers.base_env
    env = dict(base_env)
    env.update(plan.workers.extra_env)
    env.update(
        {
            "LOCAL_RANK": str(local_rank),
            "RANK": str(global_rank),
            "GROUP_RANK": str(info.group_rank),
            "ROLE_RANK": str(role_rank),
            "ROLE_NAME": plan.role,
            "LOCAL_WORLD_SIZE": str(plan.nproc_per_node),
            "WORLD_SIZE": str(world_size),
            "GROUP_WORLD_SIZE": str(info.group_world_size),
            "ROLE_WORLD_SIZE": str(role_world_size),
            "MASTER_ADDR": info.master_addr,
            "MASTER_PORT": str(info.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(plan.max_restarts),
            "TORCHELASTIC_RUN_ID": plan.run_id,
            "TORCHELASTIC_USE_AGENT_STORE": str(info.use_agent_store),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": base_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            # torchrun exports this in its own environment, so its workers inherit it.
            "TORCHELASTIC_SIGNALS_TO_HANDLE": ",".join(plan.signal_names),
        }
    )
    env.update(plan.workers.device_env[local_rank])  # --virtual-local-rank
    return env
