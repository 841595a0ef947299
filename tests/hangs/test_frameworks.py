"""Hang detection for real, unchanged framework jobs: PyTorch Lightning and the Hugging Face Trainer
under ``--hang-timeout auto`` (issue 46: no launcher call in the job, no timeout to guess).

Real workers, real gloo, real frameworks, CPU only, tiny models. Each job is a plain script as its
users write it: the framework finds torchelastic's environment (RANK, WORLD_SIZE, MASTER_ADDR...)
that launcher sets and uses the two launched processes. The progress launcher sees comes from the
workers' start-up hook only: optimizer steps (Lightning's ``LightningOptimizer`` and accelerate's
``AcceleratedOptimizer`` both call the wrapped torch optimizer's ``step``, which runs torch's global
step hooks) and blocking collectives (the Trainer gathers its token count at each step). DDP and
FSDP2 loops: tests/hangs/test_progress_without_code.py and tests/hangs/test_auto_timeout.py.

Each test takes about 25-35 s on two cores with other work beside them (about a minute when they
are overloaded), most of it the two workers' imports: Lightning's or the Trainer's, 7 to 14 s each.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import time

import pytest

from tests.conftest import LAUNCHER, launcher_env

# What both jobs share. Arguments: the rank whose data loading blocks forever (-1: none) once the
# file named next exists, the seconds the first batch takes (before the first step), the most steps,
# an evaluation every that many steps (0: none), the seconds an evaluation pass's loading takes, and
# a directory for the job's files. The rank comes from RANK, as torchrun and launcher set it.
DATA = """
import os, sys, time
import torch

block_rank, block, slow_first = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
steps, every, eval_s, output = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
rank = int(os.environ["RANK"])
BATCH = 4
EVAL_BATCHES = 8


class Samples(torch.utils.data.Dataset):
    # Loaded in the rank's own process (no loader workers). Training: the first batch is slow;
    # block_rank's next batch never comes once the block file exists (a loader reading from a dead
    # mount).
    # Evaluation: each batch takes its share of eval_s.
    def __init__(self, size, train):
        self.size, self.train, self.loaded = size, train, 0

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        if self.train:
            if self.loaded == 0:
                time.sleep(slow_first)
            if rank == block_rank and os.path.exists(block):
                while True:
                    time.sleep(1)
            self.loaded += 1
        else:
            time.sleep(eval_s / EVAL_BATCHES / BATCH)
        return self.sample(torch.Generator().manual_seed(index))
"""

# A tiny LightningModule, Trainer(accelerator="cpu", devices=2, strategy="ddp"): Lightning sees
# torchelastic's environment and launches nothing itself (the line it prints says so).
LIGHTNING = DATA + """
import lightning as L


class Regression(Samples):
    def sample(self, generator):
        x = torch.randn(8, generator=generator)
        return x, x.sum(0, keepdim=True)


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def on_validation_epoch_end(self):
        print(f"lightning: rank {rank} evaluated at step {self.trainer.global_step}", file=sys.stderr, flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=steps, val_check_interval=every or None,
                    check_val_every_n_epoch=None, limit_val_batches=EVAL_BATCHES if every else 0,
                    num_sanity_val_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=output)
environment = trainer.strategy.cluster_environment
print(f"lightning: {type(environment).__name__}, launches processes: {not environment.creates_processes_externally}, "
      f"world size {trainer.world_size}, global rank {trainer.global_rank}", file=sys.stderr, flush=True)
trainer.fit(Tiny(), torch.utils.data.DataLoader(Regression(100000, True), batch_size=BATCH),
            torch.utils.data.DataLoader(Regression(2 * EVAL_BATCHES * BATCH, False), batch_size=BATCH))
print(f"lightning: rank {rank} done, {trainer.global_step} steps", file=sys.stderr, flush=True)
"""

# A one-layer GPT-2 built from a config (nothing downloaded), the Trainer on CPU over gloo.
TRAINER = DATA + """
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Tokens(Samples):
    def sample(self, generator):
        ids = torch.randint(0, 64, (16,), generator=generator)
        return {"input_ids": ids, "labels": ids}


class Tell(TrainerCallback):
    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        inner = getattr(optimizer, "optimizer", optimizer)
        print(f"trainer: world size {args.world_size}, process index {args.process_index}, optimizer "
              f"{type(optimizer).__name__} around {type(inner).__name__}", file=sys.stderr, flush=True)

    def on_evaluate(self, args, state, control, **kwargs):
        print(f"trainer: rank {rank} evaluated at step {state.global_step}", file=sys.stderr, flush=True)


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2,
                                   bos_token_id=0, eos_token_id=0))
args = TrainingArguments(output_dir=output, use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no",
                         per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH, max_steps=steps,
                         eval_strategy="steps" if every else "no", eval_steps=every or None, logging_strategy="no",
                         disable_tqdm=True, dataloader_num_workers=0, learning_rate=1e-3)
trainer = Trainer(model=model, args=args, train_dataset=Tokens(100000, True),
                  eval_dataset=Tokens(2 * EVAL_BATCHES * BATCH, False), callbacks=[Tell()])
trainer.train()
print(f"trainer: rank {rank} done, {trainer.state.global_step} steps", file=sys.stderr, flush=True)
"""

FRAMEWORKS = {
    "lightning": ("lightning", LIGHTNING, "lightning: TorchElasticEnvironment, launches processes: False, "
                  "world size 2, global rank {rank}"),
    "trainer": ("transformers", TRAINER, "trainer: world size 2, process index {rank}, optimizer "
                "AcceleratedOptimizer around AdamW"),
}

# The learned timeout never below 8 s: well above what a busy CI machine stalls a step for, well
# below the start timeout (a detection with the learned value cannot be one with the start timeout).
AUTO = ["--hang-timeout", "auto", "--hang-start-timeout", "60", "--hang-floor", "8", "--hang-factor", "5"]


def _framework(name: str) -> tuple[str, str]:
    """The job's script and the line each rank prints about its setup; skips without the framework."""
    package, script, told = FRAMEWORKS[name]
    # Looked for, not imported: importing Lightning or transformers here would cost seconds in
    # the test process for nothing (the workers import them).
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"needs {package} (tox.ini's py3 environment installs it: issue 46's framework tests)")
    return script, told


def _run(script: str, args: list[str], tmp_path, *, block: bool = False) -> tuple[int, str, dict]:
    """``launcher --standalone --nproc-per-node 2 --hang-timeout auto ... script ARGS``, to its end: its
    exit status, its stderr and, with ``block``, what ``launcher status`` showed once both ranks took
    optimizer steps (their step: the job gives no heartbeat(step)) and a steady timeout was learned,
    when the test created the block file (empty if it never did)."""
    from tests.status.jobs import status

    path = tmp_path / "stderr"
    seen: dict = {}
    with (tmp_path / "stdout").open("wb") as out, path.open("wb") as err:
        process = subprocess.Popen([*LAUNCHER, "--standalone", "--nproc-per-node", "2", *AUTO, script, *args,
                                    str(tmp_path / "out")], env=launcher_env(), stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + 170
            while process.poll() is None and time.monotonic() < deadline:
                if block and not seen:
                    result = status(str(process.pid), "--json")
                    doc = json.loads(result.stdout) if result.returncode == 0 else {}
                    steps = [rank["step"] or 0 for rank in doc.get("ranks", ())]
                    if len(steps) == 2 and min(steps) >= 5 and doc["job"]["hang_timeouts"]["steady"]:
                        seen = {"steps": steps, "hang_timeouts": doc["job"]["hang_timeouts"]}
                        (tmp_path / "block").touch()
                time.sleep(1.0)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
    return process.returncode, path.read_text(errors="replace"), seen


@pytest.mark.parametrize("name", ["lightning", "trainer"])
@pytest.mark.timeout(200)
def test_a_rank_blocked_in_its_data_loader_is_named(name, write_script, tmp_path):
    script, told = _framework(name)
    # Rank 1's data loading blocks once a steady timeout was learned (from the optimizer steps, with
    # no launcher call in the job: 60 intervals after the first progress, seconds or tens of seconds
    # on a busy machine), so the learned timeout, not the 60 s start timeout, finds it.
    code, stderr, seen = _run(write_script(f"{name}_job.py", script),
                              ["1", str(tmp_path / "block"), "0", "100000", "0", "0"], tmp_path, block=True)
    # Seen while it ran: the optimizer steps, through the framework's optimizer wrapper.
    assert seen, f"no optimizer steps of both ranks and no learned timeout in launcher status\n{stderr}"
    assert code == 1, stderr
    for rank in (0, 1):
        assert told.format(rank=rank) in stderr, stderr
    assert re.search(r"^\[launcher\] INFO: hang timeout \(steady\) learned: [\d.]+ s \(", stderr, re.M), stderr
    assert re.search(r"^launcher: hang detected by \S+: rank 1 \(local rank 1\): no heartbeat for [\d.]+ s "
                     r"\(learned timeout [\d.]+ s\)", stderr, re.M), stderr
    assert re.search(r"^Hung ranks:\n  rank 1 on ", stderr, re.M), stderr
    assert re.search(rf"^  rank 1: __getitem__ \({name}_job\.py:\d+\) <- ", stderr, re.M), stderr
    assert stderr.count("hang detected") == 1, stderr


@pytest.mark.parametrize("name", ["lightning", "trainer"])
@pytest.mark.timeout(200)
def test_a_slow_start_and_evaluations_raise_no_false_alarm(name, write_script, tmp_path):
    script, told = _framework(name)
    # The first batch takes 9 s, more than the floor (judged against the start timeout: nothing is
    # learned yet; Lightning's set-up collectives were progress already); at step 80, once the
    # steady timeout was learned (the floor, 8 s: 60 steps), an evaluation pass of 12 s, longer
    # than it: the Trainer's with a gather at each batch, Lightning's with no optimizer step and
    # no collective until its end, only its batches (1.5 s each). 100 steps, then the job ends.
    code, stderr, _ = _run(write_script(f"{name}_job.py", script),
                           ["-1", str(tmp_path / "block"), "9", "100", "80", "12"], tmp_path)
    assert code == 0, stderr
    assert "hang detected" not in stderr, stderr
    assert re.search(r"hang timeout \(steady\) learned: ", stderr), stderr
    for rank in (0, 1):
        assert told.format(rank=rank) in stderr, stderr
        assert f": rank {rank} done, 100 steps" in stderr, stderr
        assert f": rank {rank} evaluated at step 80" in stderr, stderr
