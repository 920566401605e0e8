"""A call made again: its kernels launched from the compiled kernels' own launchers.

Triton's ``kernel[grid](...)`` binds every argument, computes the specialisation key and
looks the compiled kernel up on every call: about 45 us of the H200's host for the decode
split kernel (``benchmarks/decode_host.py``), where the compiled kernel's own launcher takes
the arguments as they are in about 12 us. A model calls attention with the same shapes in
every layer and every step, so the library remembers each *call signature*:

- ``tensor_key`` and ``call_key``: everything the checks and the compiled kernel read from a
  call (each tensor's type, shape, strides, dtype, device and 16-byte alignment, which is
  what Triton specialises pointers on; the flags; the integers all come from the shapes and
  strides). Two calls with the same key pass the same checks and bind the same way.
- ``Launch``: one kernel launch of a signature, every argument but the tensors fixed; after
  its first launch through Triton, the later ones go to the compiled kernel's launcher.
- ``Plans``: signature -> what the call launches (``decode._Plan``; the attention forward's
  and backward's ``AttentionPlan``), forgotten all at once past ``MAX_PLANS``.

The values inside the tensors are never part of a key: they are read on the GPU.
"""
from __future__ import annotations

import torch

from .. import runtime

MAX_PLANS = 1024   # call signatures remembered (a model has a few per layer)


def tensor_key(x) -> tuple | None:
    """What a tensor argument fixes about a launch (None for None); raises AttributeError or
    TypeError for something that is not a tensor, which ``call_key`` turns into None."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise TypeError("not a tensor")
    return (x.__class__, x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0)


def plain(value) -> bool:
    """A flag a key may hold: None, a bool, an int, a float, or a tuple of them (a window)."""
    if value is None or type(value) in (bool, int, float, str):
        return True
    return type(value) is tuple and all(plain(v) for v in value)


def call_key(tensors, flags) -> tuple | None:
    """The signature of a call with these tensors and flags, or None when it must take the
    checked path: no GPU (the interpreter), a flag that is not a plain value, an argument
    that is not a tensor."""
    if runtime.INTERPRET or not all(plain(f) for f in flags):
        return None
    try:
        return tuple(tensor_key(x) for x in tensors) + tuple(flags)
    except (AttributeError, TypeError):
        return None


class Plans(dict):
    """Signature -> plan, at most ``MAX_PLANS`` of them (then all are forgotten at once)."""

    def remember(self, key, plan):
        if key is not None:
            if len(self) >= MAX_PLANS:
                self.clear()
            self[key] = plan
        return plan


class Launch:
    """One kernel launch of a call signature: the kernel as Triton specialises it for the
    call, its grid, every argument but the tensors (whose places are ``slots``: an int is a
    positional argument, a str a keyword). The first call goes through Triton; on a GPU it
    keeps the compiled kernel, and the second call takes that kernel's own launcher, with
    every parameter in order (defaults included), for itself and every call after. A call
    that is never made again (a checked call no plan keeps) never builds a launcher."""

    __slots__ = ("kernel", "grid", "args", "kwargs", "slots", "compiled", "launcher", "values", "places")

    def __init__(self, kernel, grid, args, kwargs, slots):
        self.kernel, self.grid, self.args, self.kwargs = kernel, tuple(grid), list(args), dict(kwargs)
        self.slots = tuple(slots)
        self.compiled, self.launcher, self.values, self.places = None, None, None, ()
        for slot in self.slots:   # a plan lives long: it must not keep a call's tensors alive
            if isinstance(slot, str):
                self.kwargs[slot] = None
            else:
                self.args[slot] = None

    def __call__(self, *tensors):
        if self.launcher is None and self.compiled is not None:
            self._take_launcher()
        if self.launcher is not None:
            values = list(self.values)
            for place, x in zip(self.places, tensors):
                values[place] = x
            self.launcher(*values)
            return
        args, kwargs = list(self.args), dict(self.kwargs)
        for slot, x in zip(self.slots, tensors):
            if isinstance(slot, str):
                kwargs[slot] = x
            else:
                args[slot] = x
        compiled = self.kernel[self.grid](*args, **kwargs)
        if not runtime.INTERPRET and hasattr(compiled, "launch_metadata"):   # a CompiledKernel (Triton >= 3.2)
            self.compiled = compiled

    def _take_launcher(self):
        """The compiled kernel's launcher and every parameter's value, the tensors' places empty."""
        names = list(self.kernel.arg_names)
        given = dict(zip(names, self.args), **{k: v for k, v in self.kwargs.items() if k in names})
        self.values = [given[n] if n in given else p.default for n, p in zip(names, self.kernel.params)]
        self.places = tuple(s if isinstance(s, int) else names.index(s) for s in self.slots)
        self.launcher = self.compiled[self.grid + (1,) * (3 - len(self.grid))]
        self.compiled = None


class AttentionPlan:
    """What one signature of ``flash_forward`` or ``flash_backward`` launches: the buffers to
    allocate (each like an input, or a float32 shape), then the launches in order, each
    with the names of the tensors it takes. ``run(**tensors)`` returns the buffers."""

    __slots__ = ("buffers", "launches", "returns", "prepare")

    def __init__(self, buffers, launches, returns, prepare=None):
        self.buffers, self.launches, self.returns = buffers, launches, returns
        self.prepare = prepare or {}   # name -> what the checked path did to that input (a copy, a cast)

    def run(self, new_buffer, **tensors):
        for name, fn in self.prepare.items():
            tensors[name] = fn(tensors[name])
        for name, like in self.buffers:
            if isinstance(like, str):
                tensors[name] = new_buffer(None, like=tensors[like])
            else:
                tensors[name] = new_buffer(like, device=tensors["q"].device, dtype=torch.float32)
        for launch, names in self.launches:
            launch(*(tensors[n] for n in names))
        return tuple(tensors[n] for n in self.returns)
