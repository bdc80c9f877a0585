"""``RayEngine``: shard tasks as Ray tasks, on a cluster or a local Ray instance.

Each task is :func:`~fastdata.preprocess._task.run_shard_task` (items in, one shard file
out, written atomically by ``ShardWriter`` to the shared output folder), so the shards are
byte-identical to those of the local engine. The runner in the driver records each
finished shard and writes the manifest at the end, exactly as with the local engine:
resume and atomicity are the same.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator, Sequence

import cv2

from fastdata._optional import import_optional
from fastdata._system import usable_cpus
from fastdata.errors import PreprocessError
from fastdata.preprocess._task import ShardJob, ShardResult, ShardTask, run_shard_task

logger = logging.getLogger(__name__)


def _running_address() -> tuple[str | None, str]:
    """``(address, where it came from)`` of the Ray instance ``ray.init()`` would join.

    What ``ray.init()`` itself looks up: ``RAY_ADDRESS``, else the file ``ray start`` writes
    (``$RAY_TMPDIR/ray/ray_current_cluster``, ``/tmp/ray/...`` by default). Ray keeps no
    public API for the file, so its reader is looked up defensively.
    """
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env:
        return env, "RAY_ADDRESS"
    try:
        from ray._private.utils import read_ray_address  # noqa: PLC0415 - optional, private
    except ImportError:
        return None, ""
    try:
        address = read_ray_address()
    except OSError:
        return None, ""
    return (str(address).strip() or None) if address else None, "ray start"


def _answers(address: str, timeout_s: float = 2.0) -> bool:
    """Whether something accepts TCP connections at ``host:port`` (a live Ray GCS)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout_s):
            return True
    except (OSError, ValueError):
        return False


def _shard_task(task: ShardTask, job: ShardJob) -> ShardResult:
    """What a Ray worker runs: one shard, with OpenCV single-threaded (Ray is the pool)."""
    cv2.setNumThreads(1)
    return run_shard_task(task, job)


class RayEngine:
    """Runs shard tasks as Ray tasks (``pip install 'torch-fastdata[ray]'``).

    Every node must see the source files and the output folder at the same paths (a
    shared file system) and have fastdata installed. A shard is one task: choose
    ``shard_bytes`` so that there are several shards per CPU of the cluster. A task that
    raises or whose worker dies is retried by Ray ``max_retries`` times; when it still
    fails the job stops with a :class:`~fastdata.errors.PreprocessError` naming the shard
    and its inputs (the failing input itself when the task could tell). Finished shards
    stay for a resume.

    Args:
        address: Ray cluster address (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``).
            ``None``: use the Ray instance this process already runs; else the instance
            ``ray start`` runs on this machine (``RAY_ADDRESS``, or the address ``ray
            start`` recorded), with its own CPUs; else start a private local instance for
            the job (and stop it afterwards). ``"local"``: always a private instance.
            Which one was used is logged (INFO) and kept in :attr:`connection`.
        num_cpus: CPUs of a private local instance; default the CPUs this process may use.
            Ignored, with a warning, when the engine joins a running instance.
        max_retries: Retries of a failed task before the job stops.

    Raises:
        ModuleNotFoundError: Ray is not installed; the message gives the pip command.
    """

    def __init__(
        self, address: str | None = None, *, num_cpus: int | None = None, max_retries: int = 2
    ) -> None:
        self._ray = import_optional("ray", "the Ray preprocessing engine (--engine ray)")
        if address is not None and (not isinstance(address, str) or not address):
            raise ValueError(f"address must be a non-empty string or None, got {address!r}")
        if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, int)):
            raise TypeError(f"num_cpus must be an int or None, got {num_cpus!r}")
        if num_cpus is not None and num_cpus < 1:
            raise ValueError(f"num_cpus must be >= 1, got {num_cpus}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        self.address = address
        self.num_cpus = num_cpus
        self.max_retries = max_retries
        self.connection: str | None = None
        """What the last :meth:`run` used, e.g. ``"connected to the running Ray instance at
        127.0.0.1:6379 (8 CPUs)"``; ``None`` before the first run."""

    def _connect(self) -> bool:
        """Make sure Ray is initialized; return whether this call initialized it."""
        ray = self._ray
        if ray.is_initialized():
            self._announce("used the Ray instance this process already runs")
            return False
        address, origin = self.address, "the address given"
        if address is None:
            address, origin = _running_address()
            if address is not None and origin == "ray start" and not _answers(address):
                logger.warning(
                    "ray start recorded a Ray instance at %s, but nothing answers there (it "
                    "ended without `ray stop`): starting a private one",
                    address,
                )
                address = None
        direct = address not in (None, "local", "auto") and "://" not in str(address)
        if direct and not _answers(str(address)):  # Ray itself would retry for minutes
            raise PreprocessError(
                f"no Ray instance answers at {address} (from {origin}); start one with "
                "`ray start --head`, check `ray status`, or pass another address"
            )
        if address is None or address == "local":
            cpus = self.num_cpus or usable_cpus()
            ray.init(
                address="local",  # never join an instance behind our back
                num_cpus=cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
            self._announce("started a private local Ray instance for this job")
            return True
        if self.num_cpus is not None:
            logger.warning(
                "num_cpus=%d (--workers) is ignored: the running Ray instance at %s has its "
                "own CPUs",
                self.num_cpus,
                address,
            )
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (OSError, RuntimeError, ValueError) as exc:
            raise PreprocessError(
                f"cannot connect to the Ray instance at {address} ({type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}); check "
                "`ray status`, pass --address, or unset RAY_ADDRESS"
            ) from exc
        where = "cluster" if self.address is not None else "running Ray instance"
        self._announce(f"connected to the {where} at {address}")
        return True

    def _announce(self, what: str) -> None:
        cpus = int(self._ray.cluster_resources().get("CPU", 0))
        self.connection = f"{what} ({cpus} CPU{'s' * (cpus != 1)})"
        logger.info("Ray engine: %s", self.connection)

    def run(
        self, tasks: Sequence[ShardTask], job: ShardJob, advance: Callable[[int], None]
    ) -> Iterator[ShardResult]:
        """Submit every task, then yield each :class:`ShardResult` as its shard lands."""
        if not tasks:
            return
        ray = self._ray
        started = self._connect()
        try:
            remote = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=True)(
                _shard_task
            )
            cpus = int(ray.cluster_resources().get("CPU", 0))
            if len(tasks) < cpus:
                logger.warning(
                    "%d shard task(s) for %d Ray CPUs: a shard is one task, so some CPUs stay "
                    "idle; a smaller --shard-mb (shard_bytes) gives more, smaller shards",
                    len(tasks),
                    cpus,
                )
            job_ref = ray.put(job)
            pending = {remote.remote(task, job_ref): task for task in tasks}
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                task = pending.pop(ready[0])
                try:
                    result: ShardResult = ray.get(ready[0])
                except Exception as exc:
                    for ref in pending:
                        ray.cancel(ref)
                    raise PreprocessError(self._failure(task, exc)) from exc
                advance(len(task.items))
                yield result
        finally:
            if started:
                ray.shutdown()

    def _failure(self, task: ShardTask, exc: Exception) -> str:
        """What to tell the user about a task that failed ``max_retries + 1`` times."""
        cause = getattr(exc, "cause", None)  # RayTaskError wraps the task's own exception
        reason = str(cause) if isinstance(cause, Exception) else f"{type(exc).__name__}: {exc}"
        first, last = task.items[0].path, task.items[-1].path
        inputs = first if first == last else f"{first} ... {last}, {len(task.items)} inputs"
        return (
            f"shard {task.file} failed after {self.max_retries + 1} attempts ({inputs}): "
            f"{reason.strip().splitlines()[-1] if reason.strip() else type(exc).__name__}"
        )
