"""TorchX components that run distributed PyTorch jobs under ``launcher`` instead of ``torchrun``.

Registered through TorchX's ``torchx.components`` entry points as ``launcher.ddp`` and
``launcher.spmd``; they take the parameters of TorchX's ``dist.ddp`` and ``dist.spmd``, so switching
is one word::

    torchx run -s local_cwd launcher.ddp -j 2x4 --script train.py -- --lr 0.1
    torchx run -s kubernetes launcher.spmd -j 2 -h gpu.xlarge -m my.trainer

Only component functions may live in this module: TorchX offers every function it defines.
"""

# TorchX's component linter reads the signatures' annotations from the source and accepts only the
# ``typing`` spellings (Optional, Dict, List); it also needs them evaluated at runtime, so this
# module must not use ``from __future__ import annotations``.
# ruff: noqa: UP006, UP007, UP035, UP045

from typing import Dict, List, Optional

import torchx
from torchx import specs

from launcher_torchx import _build


def ddp(
    *script_args: str,
    script: Optional[str] = None,
    m: Optional[str] = None,
    image: str = torchx.IMAGE,
    name: str = "/",
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 1024,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    max_restarts: int = 0,
    launcher_args: Optional[str] = None,
) -> specs.AppDef:
    """Data-parallel job (one role, one replica per node) whose nodes run ``launcher`` instead of torchrun.

    The parameters are dist.ddp's. A single-node job meets on a free local port (``rdzv_port`` and
    ``rdzv_backend`` do not apply); a multi-node job meets at ``$RANK0_HOST:rdzv_port``, the
    rank-0 replica's host as the scheduler names it. Each worker gets torchrun's environment
    (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...). A failed job ends with launcher's failure
    report ("Root cause ...") in the replica's log.

    Args:
        script_args: arguments for the script or module (after ``--`` on the command line)
        script: the Python script each worker runs, relative to the image's working directory
        m: the module each worker runs as ``python -m``, instead of ``script``
        image: the container image (for local_cwd: unused, the current directory is used)
        name: ``{experiment}/{run}``, ``{experiment}/``, ``/{run}`` or ``{run}``; the run name
            defaults to the script's or module's name
        h: a registered named resource (host type); takes precedence over cpu, gpu and memMB
        cpu: CPUs per replica (node)
        gpu: GPUs per replica (node)
        memMB: memory per replica (node) in MB
        j: ``[MIN:]NNODESxNPROC`` (e.g. 2x4, or 1:4x8 for an elastic job of 1 to 4 nodes),
            or ``NPROC`` for one node
        env: environment variables for the job, ``K1=v1,K2=v2``
        max_retries: how many times the scheduler may retry the job
        rdzv_port: port on the rank-0 host where the nodes meet (multi-node jobs only)
        rdzv_backend: rendezvous backend for multi-node jobs: c10d (default, elastic), static,
            or an installed launcher rendezvous plugin
        mounts: mounts for the replicas, e.g. ``type=bind,src=/data,dst=/data,readonly``
        debug: set the usual PyTorch and NCCL debugging variables
        tee: which worker streams the launcher also writes to log files: 0 none, 1 stdout,
            2 stderr, 3 both
        max_restarts: restarts of the worker group by the launcher before the job fails
            (within one scheduler attempt; max_retries counts scheduler attempts)
        launcher_args: more launcher flags, as one shell-quoted string (e.g.
            ``"--numa-binding node --exit-barrier-timeout 60"``)
    """
    return _build.build_app(
        script_args=script_args,
        script=script,
        m=m,
        image=image,
        name=name,
        resource=specs.resource(cpu=cpu, gpu=gpu, memMB=memMB, h=h),
        size=_build.parse_ddp_j(j),
        env=env,
        max_retries=max_retries,
        rdzv_port=rdzv_port,
        rdzv_backend=rdzv_backend,
        mounts=mounts,
        debug=debug,
        tee=tee,
        max_restarts=max_restarts,
        launcher_args=launcher_args,
    )


def spmd(
    *args: str,
    script: Optional[str] = None,
    m: Optional[str] = None,
    image: str = torchx.IMAGE,
    name: str = "/",
    h: str = "gpu.small",
    j: str = "1x1",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    tee: int = 3,
    max_restarts: int = 0,
    launcher_args: Optional[str] = None,
) -> specs.AppDef:
    """Single-program-multiple-data job (NNODES x NPROC copies of one program) run by ``launcher``.

    The parameters are dist.spmd's: the host type ``h`` sets the resources, and ``-j NNODES``
    alone starts one process per GPU of that host type. Like launcher.ddp otherwise.

    Args:
        args: arguments for the script or module (after ``--`` on the command line)
        script: the Python script each worker runs, relative to the image's working directory
        m: the module each worker runs as ``python -m``, instead of ``script``
        image: the container image (for local_cwd: unused, the current directory is used)
        name: ``{experiment}/{run}``, ``{experiment}/``, ``/{run}`` or ``{run}``
        h: a registered named resource (host type), e.g. gpu.small or aws_p4d.24xlarge
        j: ``[MIN:]NNODES[xNPROC]``; without NPROC, one process per GPU of ``h``
        env: environment variables for the job, ``K1=v1,K2=v2``
        max_retries: how many times the scheduler may retry the job
        mounts: mounts for the replicas, e.g. ``type=bind,src=/data,dst=/data,readonly``
        debug: set the usual PyTorch and NCCL debugging variables
        rdzv_port: port on the rank-0 host where the nodes meet (multi-node jobs only)
        rdzv_backend: rendezvous backend for multi-node jobs (c10d, static, or a plugin's name)
        tee: which worker streams the launcher also writes to log files: 0 none, 1 stdout,
            2 stderr, 3 both
        max_restarts: restarts of the worker group by the launcher before the job fails
        launcher_args: more launcher flags, as one shell-quoted string
    """
    return _build.build_app(
        script_args=args,
        script=script,
        m=m,
        image=image,
        name=name,
        resource=specs.resource(h=h),
        size=_build.parse_spmd_j(j, h),
        env=env,
        max_retries=max_retries,
        rdzv_port=rdzv_port,
        rdzv_backend=rdzv_backend,
        mounts=mounts,
        debug=debug,
        tee=tee,
        max_restarts=max_restarts,
        launcher_args=launcher_args,
    )
