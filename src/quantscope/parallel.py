"""Independent evaluations, run in this process or fanned out on a Ray cluster.

An :class:`Executor` maps a top-level function over items, every call also receiving one
``shared`` value (the model bytes, statistics and rows every task needs): in process, a
plain loop; on Ray (:func:`ray_executor`, the optional ``ray`` extra), ``shared`` goes to
the object store once and every item becomes one task. Results come back in item order,
so a caller that merges them in that order gets what the loop gets. A Ray worker also gets
the target profile files this process loaded (a plan names its target by name, and a
worker never read ``--target ./my.toml``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from quantscope.types import QuantscopeError

Task = Callable[[Any, Any], Any]


class Executor(Protocol):
    """Runs ``fn(shared, item)`` for every item; ``workers``: tasks worth running at once."""

    workers: int

    def map(self, fn: Task, shared: Any, items: Sequence[Any]) -> list[Any]: ...


@dataclass(frozen=True)
class InProcess:
    """The serial loop (what runs without ``--ray``)."""

    workers: int = 1

    def map(self, fn: Task, shared: Any, items: Sequence[Any]) -> list[Any]:
        return [fn(shared, item) for item in items]


@dataclass(frozen=True)
class RayExecutor:
    """Tasks on a Ray cluster (one CPU each); ``workers``: the cluster's CPUs."""

    workers: int
    started: bool  # this process started the (local) cluster and stops it in close()

    def map(self, fn: Task, shared: Any, items: Sequence[Any]) -> list[Any]:
        import ray

        from quantscope.targets import loaded_profiles

        ref = ray.put((shared, loaded_profiles()))
        remote = ray.remote(num_cpus=1, max_retries=0)(_on_worker)
        return ray.get([remote.remote(fn, ref, item) for item in items])

    def close(self) -> None:
        import ray

        if self.started:
            ray.shutdown()


def _on_worker(fn: Task, bundle: tuple[Any, dict[str, Any]], item: Any) -> Any:
    """``fn(shared, item)`` on a Ray worker that first knows the caller's profile files."""
    from quantscope.emulate.release import tune_malloc
    from quantscope.targets import know_profiles

    tune_malloc()  # as the command does (a worker is a process of its own)
    shared, profiles = bundle
    know_profiles(profiles)
    return fn(shared, item)


def ray_executor(address: str | None = None, *, num_cpus: int | None = None) -> RayExecutor:
    """Join the Ray cluster at ``address``, or the one this process already joined, or
    start a local one (``address`` None or "local"; ``num_cpus``: its size)."""
    try:
        import ray
    except ImportError:
        raise QuantscopeError(
            "--ray needs Ray: pip install 'quantscope[ray]' (or pip install ray)"
        ) from None
    started = False
    if not ray.is_initialized():
        local = address in (None, "", "local")
        try:
            ray.init(address=None if local else address, num_cpus=num_cpus if local else None,
                     include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise QuantscopeError(f"cannot join the Ray cluster at {address}: {exc}") from None
        started = local
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return RayExecutor(workers=max(1, cpus), started=started)


def chunks(n: int, parts: int) -> list[range]:
    """``range(n)`` split into at most ``parts`` contiguous, nearly equal, non-empty runs."""
    parts = max(1, min(parts, n))
    bounds = [round(k * n / parts) for k in range(parts + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


__all__ = ["Executor", "InProcess", "RayExecutor", "chunks", "ray_executor"]
