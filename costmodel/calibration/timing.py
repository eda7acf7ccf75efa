"""How one kernel call is timed: ``Timer`` (warm-up, samples until a budget is spent, CUDA events on a GPU and
``perf_counter`` on the CPU, the device synchronised) and ``Pool`` (random inputs as disjoint slices of one buffer,
rotated over sets larger than the last-level cache, so each call reads from memory)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from costmodel.calibration import kernels as K

if TYPE_CHECKING:
    import torch


class Timer:
    """Times a kernel: warm-up calls, then samples until a time budget (and a minimum count) is spent."""

    def __init__(self, device: torch.device, warmup: int = 2, max_samples: int = 1000) -> None:
        self.device, self.warmup, self.max_samples = device, warmup, max_samples
        # back-to-back calls per sample when one call is shorter than this (timer and event resolution)
        self.min_sample_s = 50e-6

    def __call__(self, call: Callable[[int], object], budget_s: float, min_samples: int) -> list[float]:
        """``call(i)`` runs the kernel on input set i (the caller rotates); returns seconds per call, one per sample."""
        torch = K.require_torch()
        events = self.device.type == "cuda"
        for i in range(self.warmup):
            call(i)
        K.synchronize(self.device)
        t0 = time.perf_counter()
        call(self.warmup)
        K.synchronize(self.device)
        probe = time.perf_counter() - t0
        inner = math.ceil(self.min_sample_s / max(probe, 1e-9)) if probe < self.min_sample_s else 1
        i = self.warmup + 1
        samples: list[float] = []
        pairs: list[tuple[Any, Any]] = []
        start = time.perf_counter()
        while len(pairs) + len(samples) < self.max_samples and (
            len(pairs) + len(samples) < min_samples or time.perf_counter() - start < budget_s
        ):
            if events:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(inner):
                    call(i)
                    i += 1
                end.record()
                pairs.append((begin, end))
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    call(i)
                    i += 1
                samples.append((time.perf_counter() - t0) / inner)
        if events:
            K.synchronize(self.device)
            samples = [b.elapsed_time(e) * 1e-3 / inner for b, e in pairs]
        return samples


ALIGN = 64  # elements: every tensor the pool hands out starts at a multiple of this offset


class Pool:
    """One large buffer of random numbers; a kernel's input sets are disjoint slices of it.

    A set's tensors lie side by side and successive sets follow one another; a set that would run past the end of the
    buffer starts over at its front, whole (it never wraps around onto itself), and the buffer grows when one set is
    larger than it. So no two tensors of a set share an element (checked as each is handed out): a kernel that
    writes one of its inputs (attention writes the new keys and values into its KV cache) never writes into another,
    which torch refuses ("some elements of the input tensor and the written-to tensor refer to a single memory
    location") or, worse, computes on silently. Rotating over enough sets (together more than twice the last-level
    cache) makes every call read its inputs from memory, without generating new random numbers per set."""

    def __init__(
        self, device: torch.device, dtype: torch.dtype, cache_bytes: int, seed: int = 0, size_bytes: int | None = None
    ) -> None:
        torch = K.require_torch()
        self.device, self.dtype, self.cache_bytes = device, dtype, cache_bytes
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.item = int(torch.empty((), dtype=dtype).element_size())
        # elements: the buffer's size at first, and its room beyond the set when one set outgrows it
        self.spare = (size_bytes or max(4 * cache_bytes, 64 << 20)) // self.item
        self.buf = self._fill(self.spare)
        self.cursor = 0  # where the next set's (or the current set's next) tensor starts
        self.sizing = False  # a dry run of a set (``footprint``): ``take`` hands out shapes only
        self.members: list[tuple[int, int]] | None = None  # [first, end) elements of the current set's tensors

    def _fill(self, elems: int) -> torch.Tensor:
        torch = K.require_torch()
        return torch.randn(elems, device=self.device, dtype=self.dtype, generator=self.gen)

    def take(self, *shape: int) -> torch.Tensor:
        """A random tensor of ``shape`` for the set being made (``sets``): the buffer's next slice, disjoint from the
        set's other tensors. Outside a set, a set of its own."""
        torch = K.require_torch()
        if self.members is None and not self.sizing:
            return self.one_set(lambda p: (p.take(*shape),))[0]
        n = math.prod(shape)
        first, self.cursor = self.cursor, self.cursor + -(-n // ALIGN) * ALIGN
        if self.sizing:
            return torch.empty(shape, device="meta", dtype=self.dtype)
        view = self.buf[first : first + n].view(shape)
        self._claim(view)
        return view

    def _claim(self, view: torch.Tensor) -> None:
        """Add ``view`` to the current set; AssertionError if it is not a contiguous slice inside the buffer or it
        shares an element with another tensor of the set (from torch's storage offsets and sizes)."""
        assert self.members is not None
        storage = view.untyped_storage()
        first = int(view.storage_offset())
        end = first + view.numel()
        if (
            not view.is_contiguous()
            or storage.data_ptr() != self.buf.untyped_storage().data_ptr()
            or end * self.item > storage.nbytes()
        ):
            raise AssertionError(f"pool: input {tuple(view.shape)} at elements [{first}, {end}) is not in the buffer")
        for lo, hi in self.members:
            if first < hi and lo < end:
                raise AssertionError(
                    f"pool: input {tuple(view.shape)} at elements [{first}, {end}) overlaps another input of its set "
                    f"at [{lo}, {hi})"
                )
        self.members.append((first, end))

    def ints(self, high: int, *shape: int) -> torch.Tensor:
        torch = K.require_torch()
        return torch.randint(0, high, shape, device=self.device, generator=self.gen)

    def rotation(self, rows: int, pairs: int) -> torch.Tensor:
        """A random RoPE rotation table [rows, pairs] (unit complex numbers)."""
        torch = K.require_torch()
        angles = torch.rand(rows, pairs, device=self.device, generator=self.gen) * 6.2832
        return torch.polar(torch.ones_like(angles), angles)

    def footprint(self, make: Callable[[Pool], tuple[Any, ...]]) -> int:
        """Elements of the buffer that one set of ``make`` takes: a dry run in which ``take`` hands out meta tensors
        (shapes without memory)."""
        cursor, self.cursor, self.sizing = self.cursor, 0, True
        try:
            make(self)
            return self.cursor
        finally:
            self.cursor, self.sizing = cursor, False

    def one_set(self, make: Callable[[Pool], tuple[Any, ...]], size: int | None = None) -> tuple[Any, ...]:
        """One input set from ``make``, its tensors side by side after the previous set's, or from the front of the
        buffer when it would not fit before the end (a new, larger buffer when it does not fit at all). ``size``: its
        ``footprint``, if known."""
        size = self.footprint(make) if size is None else size
        if size > self.buf.numel():
            self.buf = self._fill(size + self.spare)
            self.cursor = 0
        elif self.cursor + size > self.buf.numel():
            self.cursor = 0
        start, self.members = self.cursor, []
        try:
            inputs = make(self)
        finally:
            self.members = None
        if self.cursor - start != size:
            raise AssertionError(f"pool: a set took {self.cursor - start} elements, its dry run {size}")
        return inputs

    def sets(self, make: Callable[[Pool], tuple[Any, ...]], set_bytes: float) -> list[tuple[Any, ...]]:
        """Input sets from ``make``: enough that a pass over them all reads more than twice the last-level cache
        (at most 32)."""
        count = min(32, max(1, math.ceil(2 * self.cache_bytes / max(set_bytes, 1.0))))
        size = self.footprint(make)
        return [self.one_set(make, size) for _ in range(count)]
