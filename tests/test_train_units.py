"""Typed config, LR schedule, clipping and signal/log helpers of the training loop."""
from __future__ import annotations

import math
import os
import pickle
import signal

import pytest
import torch
import yaml

from tests.model_helpers import tiny_cfg
from trainer.config import Config, ConfigError, load_config
from trainer.observability.logger import TrainLogger, format_iteration, log_path
from trainer.step.optim import build_optimizer, clip_gradients
from trainer.step.schedule import LRSchedule
from trainer.runtime.signals import WOKEN_S, StopSignal


def test_config_is_a_frozen_typed_tree_and_names_missing_keys(tmp_path):
    import dataclasses

    from primus_contract.schema import apply_schema

    resolved = apply_schema({"trainer": {"model": {"hidden_size": 128}, "data": {"train": {"path": "/x"}},
                                         "lora": {"target_modules": ["a", "b"]}}})
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(resolved, sort_keys=False))
    cfg = load_config(str(p))
    assert dataclasses.is_dataclass(cfg) and type(cfg.trainer.model).__name__ == "TrainerModel"
    assert [f.name for f in dataclasses.fields(cfg.trainer.lora)] == list(resolved["trainer"]["lora"])  # the contract's keys
    assert cfg.trainer.model.hidden_size == 128 and cfg["trainer"]["model"]["hidden_size"] == 128
    assert cfg.trainer.data.train.path == "/x"  # a key named `path` is a key
    assert cfg.trainer.lora.target_modules == ("a", "b")
    with pytest.raises(KeyError, match="no key 'trainer.model.hidden'"):
        cfg["trainer"]["model"]["hidden"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.trainer.model.hidden_size = 3
    assert cfg.to_dict() == resolved and cfg.to_dict()["trainer"]["lora"]["target_modules"] == ["a", "b"]
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert ("trainer.model.hidden_size", 128) in cfg.flatten()
    assert Config.from_dict(cfg.to_dict()) == cfg
    del resolved["trainer"]["model"]["ffn_hidden_size"]
    with pytest.raises(ConfigError, match="no key 'trainer.model.ffn_hidden_size'"):
        Config.from_dict(resolved)  # at load, not at first use
    resolved["trainer"]["model"].update(ffn_hidden_size=352, wandb=1)
    with pytest.raises(ConfigError, match="'trainer.model.wandb', which the contract does not define"):
        Config.from_dict(resolved)


def test_lr_schedule_hand_values():
    s = LRSchedule(lr=1.0, min_lr=0.1, warmup_iters=4, decay_iters=14, decay="cosine")
    assert [s.lr_at(i) for i in (1, 2, 4)] == [0.25, 0.5, 1.0]
    assert s.lr_at(9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert s.lr_at(14) == pytest.approx(0.1) and s.lr_at(20) == pytest.approx(0.1)
    lin = LRSchedule(1.0, 0.0, 0, 10, "linear")
    assert lin.lr_at(5) == pytest.approx(0.5)
    assert LRSchedule(1.0, 0.0, 2, 10, "constant").lr_at(7) == 1.0
    with pytest.raises(ValueError):
        LRSchedule(1.0, 0.0, 0, 10, "exp")


def test_clip_to_global_norm_and_no_decay_on_vectors():
    a = torch.nn.Parameter(torch.zeros(2, 2))
    b = torch.nn.Parameter(torch.zeros(3))
    a.grad, b.grad = torch.full((2, 2), 3.0), torch.full((3,), 4.0)
    expected = math.sqrt(4 * 9 + 3 * 16)
    norm = clip_gradients([a, b], 1.0)
    assert float(norm) == pytest.approx(expected)
    clipped = math.sqrt(float(a.grad.pow(2).sum() + b.grad.pow(2).sum()))
    assert clipped == pytest.approx(1.0, rel=1e-5)
    sched = tiny_cfg(trainer={"schedule": {"lr": 1e-3, "weight_decay": 0.1, "adam_beta1": 0.8, "adam_beta2": 0.95,
                                           "adam_eps": 1e-6}}).trainer.schedule
    opt = build_optimizer([a, b], sched)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert opt.param_groups[0]["betas"] == (0.8, 0.95) and opt.param_groups[0]["eps"] == 1e-6


def test_global_grad_norm_by_multi_tensor_kernels_equals_the_per_parameter_sum():
    """The norm in torch's foreach kernels (grouped by dtype) equals the float64 sum of every parameter's squares;
    a TP-duplicated parameter counts on tp_rank 0 only; parameters without a gradient count 0."""
    from trainer.step.optim import global_grad_norm

    g = torch.Generator().manual_seed(0)
    params = []
    for i, (shape, dtype) in enumerate([((16, 64), torch.float32), ((64, 16), torch.bfloat16), ((7,), torch.float32),
                                        ((33, 5), torch.float16), ((4, 4), torch.float32)]):
        p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype))
        p.grad = (torch.randn(shape, generator=g) * (i + 1)).to(dtype)
        p.tensor_model_parallel = i != 2  # the vector is replicated over TP
        params.append(p)
    params.append(torch.nn.Parameter(torch.zeros(3)))  # no gradient
    ref = {r: math.sqrt(sum(float(p.grad.double().pow(2).sum()) for i, p in enumerate(params[:5]) if r == 0 or i != 2))
           for r in (0, 1)}
    assert ref[0] != ref[1]
    for rank in (0, 1):
        norm = global_grad_norm(params, tp_rank=rank)
        assert norm.dtype == torch.float32 and norm.dim() == 0
        assert float(norm) == pytest.approx(ref[rank], rel=1e-5)
    assert float(global_grad_norm([params[-1]])) == 0.0


def test_global_grad_norm_launches_do_not_grow_with_the_parameter_count():
    """The norm's ops are a fixed handful whatever the adapter count (a GPU launches each: three a parameter left the
    8B's GPU waiting on the host)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainer.step.optim import global_grad_norm

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    def ops(count: int) -> int:
        params = []
        for i in range(count):
            p = torch.nn.Parameter(torch.zeros(4, 3))
            p.grad = torch.full((4, 3), float(i))
            params.append(p)
        with Count() as c:
            global_grad_norm(params)
        return c.n

    assert ops(256) == ops(4) <= 12


def test_stop_signal_records_sigterm_and_sigusr2_only():
    stop = StopSignal().install()
    try:
        assert signal.getsignal(signal.SIGUSR1) != stop._handler  # SIGUSR1 is never taken
        assert signal.getsignal(signal.SIGTERM) == stop._handler
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stop.requested and stop.name == "SIGUSR2"
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.name == "SIGUSR2"  # first one wins
    finally:
        stop.uninstall()


def test_stop_signal_knows_a_rank_woken_by_sigcont():
    stop = StopSignal().install()
    try:
        assert not stop.woken
        os.kill(os.getpid(), signal.SIGCONT)  # as Slurm ends a step: SIGCONT first (a stopped rank wakes), then SIGTERM
        assert stop.woken and not stop.requested
        stop.continued_at -= WOKEN_S + 1  # long ago: a later error is not the wake-up's
        assert not stop.woken
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGCONT) == signal.SIG_DFL


def test_log_files_per_attempt_and_line_format(tmp_path):
    assert log_path(str(tmp_path), 0, 0).endswith("logs/rank-0/debug.log")
    assert log_path(str(tmp_path), 0, 2).endswith("logs/rank-0/debug.attempt-2.log")
    line = format_iteration(10, 100, 2.345678, 1e-4, 0.1234, 1234.5, 12.345, 1.234, 2.345, 123.44)
    assert line == ("iteration 10/100 | lm loss 2.345678E+00 | lr 1.000000E-04 | grad norm 1.234E-01 | "
                    "tokens/s/GPU 1234.5 | TFLOP/s/GPU 12.35 | mem alloc GiB 1.23 | mem peak GiB 2.35 | ms/iter 123.4")
    class Sink(list):
        def write(self, s): self.append(s)
        def flush(self): pass
    sink = Sink()
    log = TrainLogger(str(tmp_path), rank=0, attempt=1, stream=sink)
    log.line("hello | x 1")
    log.close()
    text = (tmp_path / "logs" / "rank-0" / "debug.attempt-1.log").read_text()
    assert text == sink[0] and text.startswith("[") and text.endswith("] hello | x 1\n")
    silent = TrainLogger(str(tmp_path / "r1"), rank=1, attempt=0, stream=sink)
    silent.line("nothing")
    assert len(sink) == 1 and not (tmp_path / "r1").exists()


def test_seed_streams_gives_each_resume_iteration_its_own_streams():
    """seed_streams, which a resume on another layout calls (trainer.__main__._build: the saved RNG streams do not
    map onto the new ranks, and the model-build state would replay step 1's dropout masks), is deterministic per
    iteration and differs between iterations, for the default generator and the model-parallel tracker. The call
    site itself is not exercised here."""
    from megatron.core import tensor_parallel

    from tests.model_helpers import dist_session, tiny_cfg
    from trainer.runtime.distributed import seed_streams

    def draws(iteration):
        seed_streams(1234, pp_rank=0, dp_rank=0, iteration=iteration)
        with tensor_parallel.get_cuda_rng_tracker().fork():
            tracked = torch.rand(4)
        return torch.cat([torch.rand(4), tracked])

    with dist_session(tiny_cfg()):
        first, again, later = draws(0), draws(0), draws(500)
    assert torch.equal(first, again) and not torch.equal(first[:4], later[:4]) and not torch.equal(first[4:], later[4:])


def test_move_batch_keeps_cu_seqlens_on_the_host():
    """packed_seq_params reads cu_seqlens on the host: moved to the device with the rest of the batch, reading it
    back cost a device-to-host sync every micro-batch (found by the GPU-path audit)."""
    import torch

    from trainer.step.evaluate import move_batch

    batch = {"tokens": torch.zeros(2, 4, dtype=torch.long), "cu_seqlens": torch.tensor([0, 3, 8], dtype=torch.int32),
             "max_seqlen": 5}
    moved = move_batch(batch, torch.device("meta"))
    assert moved["tokens"].device.type == "meta" and moved["cu_seqlens"].device.type == "cpu"
    assert moved["max_seqlen"] == 5
