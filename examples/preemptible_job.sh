#!/bin/bash
#SBATCH --job-name=preemptible
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=preemptible-%j.out
#SBATCH --signal=USR1@120
# --requeue: Slurm may put the job back in the queue (and launcher's --requeue does, after the save).
# --open-mode=append: the restarted job's output follows the first attempt's instead of replacing it.
# --signal=USR1@120: two minutes before the time limit, USR1 to every task: save, requeue, go on.
# No --kill-on-bad-exit: a preempted node exits with status 75, and must not cut the others' grace short.
srun --ntasks-per-node=1 launcher --nproc-per-node=2 --preemption-signals=SIGTERM,SIGUSR1 \
    --preemption-grace=60 --requeue preemptible_train.py --ckpt-dir=ckpt
