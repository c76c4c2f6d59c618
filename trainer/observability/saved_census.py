"""What one micro-batch's forward keeps for backward, by module: the activation-memory breakdown.

    census = SavedTensorCensus(model, device)
    census.start()            # before a step; records until backward first reads a saved tensor
    ...forward + backward...
    text = census.report()    # None if nothing was recorded

Every tensor autograd saves (torch.autograd.graph.saved_tensors_hooks: ctx.save_for_backward of
custom Functions, TE's and megatron's included) is attributed to the innermost module running when it
was saved and counted once per underlying storage, at the storage's full size (a view keeps its whole
buffer alive: v split out of a fused qkv output would hold all of qkv); parameters and buffers are not
counted. Layer indices are folded
(decoder.layers.*.mlp.linear_fc1). Totals cover the model forwards run before the first backward: one
micro-batch without pipeline parallelism, up to PP of them on early pipeline stages (the report says how
many). The report also gives the
allocator's growth over the same forward, so memory kept some other way (ctx attributes, caches,
the loss's buffers) shows as the difference. trainer.observability.profiling runs it over the first profiled step.
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Optional

import torch

MIB = 1024.0 ** 2


def _pattern(name: str) -> str:
    return re.sub(r"\.\d+(?=\.|$)", ".*", name) or "(model)"


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    try:
        st = t.untyped_storage()
        return st.data_ptr(), st.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):  # wrapper subclasses without one storage
        return id(t), t.numel() * t.element_size()


class SavedTensorCensus:
    def __init__(self, model, device: torch.device) -> None:
        self.names = {id(m): _pattern(n) for n, m in model.named_modules()}
        self.root = id(model)
        self.forwards = 0  # model forwards recorded (pipeline schedules run several before a backward)
        # weights (and views of them, e.g. W.t() saved by a matmul) are not activations
        self.weights = {_storage_key(t)[0] for t in (*model.parameters(), *model.buffers())}
        self.device = device
        self.stack: list[str] = []
        self.storages: dict[int, tuple[str, int, str]] = {}
        self.recording = False
        self.alloc0 = self.alloc1 = None
        self._ctx = None
        self._handles: list = []

    # ------------------------------------------------------------------ hooks
    def _pre(self, module, _args):
        if self.recording and id(module) == self.root:
            self.forwards += 1
        self.stack.append(self.names.get(id(module), type(module).__name__))

    def _post(self, module, _args, _out):
        if self.stack:
            self.stack.pop()

    def _pack(self, t):
        if self.recording and isinstance(t, torch.Tensor) and t.device.type == self.device.type:
            key, nbytes = _storage_key(t)
            if key and key not in self.storages and key not in self.weights:
                where = self.stack[-1] if self.stack else "(outside modules)"
                self.storages[key] = (where, nbytes, f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}")
        return t

    def _unpack(self, t):
        if self.recording:
            self.stop()
        return t

    def _allocated(self) -> Optional[int]:
        return torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else None

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        from torch.nn.modules import module as nn_module

        self.alloc0 = self._allocated()
        self._handles = [nn_module.register_module_forward_pre_hook(self._pre),
                         nn_module.register_module_forward_hook(self._post)]
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        self.recording = True

    def stop(self) -> None:
        """Stop recording (the first backward read, or the end of the step); hooks stay until close()."""
        if self.recording:
            self.recording = False
            self.alloc1 = self._allocated()

    def close(self) -> None:
        self.stop()
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self._ctx = None
        for h in self._handles:
            h.remove()
        self._handles = []

    # ------------------------------------------------------------------ results
    def totals(self) -> dict[str, int]:
        by_module: dict[str, int] = defaultdict(int)
        for where, nbytes, _ in self.storages.values():
            by_module[where] += nbytes
        return dict(by_module)

    def report(self) -> Optional[str]:
        if not self.storages:
            return None
        by_module = self.totals()
        total = sum(by_module.values())
        examples: dict[str, str] = {}
        for where, _, desc in sorted(self.storages.values(), key=lambda s: -s[1]):
            examples.setdefault(where, desc)
        lines = [f"saved for backward by {self.forwards} micro-batch forward(s) before the first backward: "
                 f"{total / MIB:.2f} MiB in {len(self.storages)} storages"]
        if self.alloc0 is not None and self.alloc1 is not None:
            grown = self.alloc1 - self.alloc0
            lines.append(f"allocator growth over the same forward: {grown / MIB:.1f} MiB "
                         f"(not in saved tensors: {(grown - total) / MIB:.1f} MiB)")
        lines.append(f"{'MiB':>10}  {'share':>6}  module (largest storage)")
        for where, nbytes in sorted(by_module.items(), key=lambda kv: -kv[1]):
            lines.append(f"{nbytes / MIB:10.2f}  {100.0 * nbytes / total:5.1f}%  {where}  ({examples[where]})")
        return "\n".join(lines) + "\n"

    def total_mib(self) -> float:
        return sum(self.totals().values()) / MIB
