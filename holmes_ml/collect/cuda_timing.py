"""CUDA-event timing of NCCL operators, resolved off the hot path.

On NCCL the host returns from a collective long before the GPU finishes it, so wall-clock timing
around the call measures only the launch. Instead we record a CUDA event on the current stream
just before the call (the moment the stream *arrives* at the operator, after the compute queued
before it) and one just after it (NCCL makes the current stream wait for the operator, so this
event fires at completion; for ``async_op=True`` it is recorded after ``Work.wait()``). Reading
an event's time synchronizes with the GPU, so :meth:`CudaEventTimer.resolve` does it in one
batch at ``step()``/flush instead of per call.

This module is deliberately minimal and is **not exercised by the test suite** (the CI machine
has no GPU); the gloo (CPU) path of :mod:`holmes_ml.collect.logger` is the tested one.
"""

from __future__ import annotations

from typing import Any


class CudaEventTimer:
    """Pairs of CUDA events per operator, turned into durations in batches.

    Parameters
    ----------
    torch_module:
        The imported ``torch`` module (passed in so this module never imports torch itself).
    """

    def __init__(self, torch_module: Any) -> None:
        self._torch = torch_module
        self._pending: list[tuple[list[Any], Any, Any]] = []

    def start(self) -> Any:
        """Record and return the arrival event on the current stream."""
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, row: list[Any], start_event: Any, start_index: int, end_index: int) -> None:
        """Record the completion event; ``row[end_index]`` is filled by :meth:`resolve`."""
        end = self._torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((row, start_event, end))
        row[end_index] = None  # marks the row as waiting for resolution

    def resolve(self, start_index: int, end_index: int) -> int:
        """Wait for all recorded events and set each row's end to its start + the GPU time.

        Rows keep host ``perf_counter_ns`` starts; the end becomes ``start + elapsed`` (ns), so
        the logger derives the duration the same way for wall-clock and CUDA rows.

        Returns
        -------
        int
            Number of rows resolved.
        """
        pending, self._pending = self._pending, []
        for row, start, end in pending:
            end.synchronize()
            row[end_index] = row[start_index] + round(start.elapsed_time(end) * 1e6)  # ms->ns
        return len(pending)
