"""The CUDA discipline of TensorRT instances: a worker thread makes the device's primary context current before any
CUDA call and releases it after, whatever happens between (pycuda contexts are per thread), and each call runs on an
instance of its own (execution context, CUDA stream, buffers), taken from a pool and given back."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class CudaContext(Protocol):
    """What the discipline needs of a context (pycuda's primary context, through a small adapter)."""

    def push(self) -> None: ...

    def pop(self) -> None: ...


@contextmanager
def current(context: CudaContext) -> Iterator[None]:
    """`context` current on this thread for the block: pushed before, popped after, also when the block raises."""
    context.push()
    try:
        yield
    finally:
        context.pop()


class InstancePool(Generic[T]):
    """One instance per concurrent execution (the version's `instance_count`), each used by one call at a time; a
    call waits for a free one (never longer than a forward, since the worker threads are as many as the instances)."""

    def __init__(self, instances: list[T]) -> None:
        if not instances:
            raise ValueError("an instance pool needs at least one instance")
        self.instances = list(instances)
        self._free: queue.SimpleQueue[T] = queue.SimpleQueue()
        for instance in instances:
            self._free.put(instance)

    @contextmanager
    def acquire(self) -> Iterator[T]:
        instance = self._free.get()
        try:
            yield instance
        finally:
            self._free.put(instance)
