"""Data-parallel training (DDP, FSDP) on 2 CPU processes (gloo) equals one process with the same global batch."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from vitlab.train import Recipe, train
from vitlab.train.report import read_metrics

STEPS = 3


def _recipe(data: dict, accum_steps: int = 1, parallel: str = "ddp", int8: bool = False) -> Recipe:
    return Recipe.from_dict({
        "model": {"name": "ViT-Ti/16", "embed_dim": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64, "img_size": 28,
                  "patch_size": 7, "in_chans": 1},
        "data": data,  # inception crop + flips: ranks slice one batch
        # eps 1e-6: the key bias gets an exactly-zero gradient in theory (softmax ignores it), ~1e-10 rounding noise in
        # practice, which Adam with eps 1e-8 would blow up to lr-sized steps of arbitrary sign in either run
        "optim": {"name": "adamw", "lr": 3e-3, "eps": 1e-6, "weight_decay": 0.05, "clip_grad_norm": 0.5},
        "schedule": {"name": "cosine", "warmup_steps": 1},
        "train": {"batch_size": 16, "accum_steps": accum_steps, "steps": STEPS, "precision": "fp32",
                  "label_smoothing": 0.1, "parallel": parallel, "int8": int8,
                  "evaluators": {
                      "eval": {"type": "classification", "max_samples": 200, "batch_size": 200},
                      # the few-shot probe at step 2 and the end: under FSDP its model is gathered from every rank
                      "fewshot": {"type": "fewshot", "every": 2, "shots": [2], "seeds": 1, "train_samples": 100,
                                  "eval_samples": 100, "batch_size": 200}}},
    })


def _worker(rank: int, world: int, port: int, data: dict, run_dir: str, accum: int, parallel: str,
            int8: bool = False) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    losses: list[float] = []
    try:
        train(_recipe(data, accum, parallel, int8), run_dir, progress=False, device="cpu",
              on_step=lambda step, r: losses.append(r.loss))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    with open(os.path.join(run_dir, f"losses{rank}.json"), "w") as f:
        json.dump(losses, f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
# accumulation exercises DDP's no_sync path; FSDP shards per block and gathers full state for eval / checkpoints;
# train.int8 quantises per token and per weight row, so splitting the batch over processes changes nothing either
@pytest.mark.parametrize(("accum", "parallel", "int8"), [(2, "ddp", False), (1, "fsdp", False), (1, "ddp", True)],
                         ids=["ddp+accum2", "fsdp", "ddp+int8"])
def test_two_process_ddp_matches_one_process(tmp_path, synthetic_data, accum, parallel, int8):
    single = []
    ref = train(_recipe(synthetic_data, accum, int8=int8), tmp_path / "single", progress=False, device="cpu",
                on_step=lambda step, r: single.append(r.loss))
    run_dir = tmp_path / "ddp"
    mp.spawn(_worker, args=(2, _free_port(), synthetic_data, str(run_dir), accum, parallel, int8), nprocs=2,
             join=True)
    ranks = [json.loads((run_dir / f"losses{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]  # the logged loss is the mean over processes
    torch.testing.assert_close(torch.tensor(ranks[0]), torch.tensor(single), rtol=1e-5, atol=1e-5)
    a, b = load_file(ref["model"]), load_file(str(run_dir / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-5, msg=k)
    assert json.loads((run_dir / "report.json").read_text())["world_size"] == 2
    # the evaluator ran on the main process at the declared steps, on the same weights as the single process's
    probe = [[r for r in read_metrics(d / "metrics.jsonl") if r["split"] == "fewshot"] for d in (tmp_path / "single",
                                                                                                run_dir)]
    assert [r["step"] for r in probe[1]] == [2, STEPS] == [r["step"] for r in probe[0]]
    assert [r["2shot"] for r in probe[1]] == pytest.approx([r["2shot"] for r in probe[0]], abs=0.02)
