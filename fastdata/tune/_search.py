"""The search behind ``autotune``: each configuration measured once, within budgets."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from fastdata._system import format_bytes
from fastdata.errors import InsufficientMemoryError
from fastdata.tune._measure import LoaderConfig, Measurement, predict_bytes, run_window

# Before a worker has been measured, its unique memory is guessed as this plus one batch
# (the samples it holds while collating); measured worker memory replaces the guess.
_WORKER_BYTES_PRIOR = 32 << 20
# Start the worker search this much above the count that exactly matches the step.
_MARGIN = 1.2
# A deeper prefetch queue smooths the bursts of worker batches; it does not double their
# rate: below this share of the best rate measured, workers are not tried deeper.
_PREFETCH_MIN_SHARE = 0.5


class Search:
    """Measures configurations once each, within the time and memory budgets."""

    def __init__(
        self,
        *,
        dataset: Any,
        batch_size: int,
        step: Callable[[Any], Any] | None,
        extra_kwargs: dict[str, Any],
        window_s: float,
        deadline: float,
        budget: int,
        bar: Any,
    ) -> None:
        self.dataset, self.batch_size, self.step = dataset, batch_size, step
        self.extra_kwargs, self.window_s, self.deadline = extra_kwargs, window_s, deadline
        self.budget, self.bar = budget, bar
        self.measured: dict[LoaderConfig, Measurement] = {}
        self.refused: list[tuple[LoaderConfig, int]] = []  # (config, predicted bytes)
        self.out_of_time = False
        self.batch_bytes = 0
        self.worker_bytes: int | None = None

    def worker_bytes_guess(self) -> int:
        if self.worker_bytes is not None:
            return self.worker_bytes
        return _WORKER_BYTES_PRIOR + self.batch_bytes

    def predicted(self, config: LoaderConfig) -> int:
        return predict_bytes(config, self.batch_bytes, self.worker_bytes_guess())

    def fits(self, config: LoaderConfig) -> bool:
        """Whether ``config`` is predicted within budget; remembers it as refused if not."""
        predicted = self.predicted(config)
        if predicted > self.budget:
            self.refused.append((config, predicted))
            return False
        return True

    def baseline(self, config: LoaderConfig) -> Measurement:
        """Measure the first configuration whatever the budgets: it sizes the batches.

        Raises:
            InsufficientMemoryError: Two batches alone exceed the memory budget.
        """
        found = self._run(config)
        if 2 * self.batch_bytes > self.budget:
            raise InsufficientMemoryError(
                f"one batch of {self.batch_size} takes {format_bytes(self.batch_bytes)}; "
                f"reading even without workers holds two, over the memory budget of "
                f"{format_bytes(self.budget)} (raise ram_budget or lower batch_size)"
            )
        return found

    def measure(self, config: LoaderConfig) -> Measurement | None:
        """The measurement of ``config``; ``None`` if over budget or out of time."""
        if config in self.measured:
            return self.measured[config]
        if not self.fits(config):
            return None
        if time.perf_counter() + 1.5 * self.window_s > self.deadline:
            self.out_of_time = True
            return None
        return self._run(config)

    def _run(self, config: LoaderConfig) -> Measurement:
        window = run_window(
            self.dataset,
            self.batch_size,
            config,
            step=self.step,
            extra_kwargs=self.extra_kwargs,
            window_s=self.window_s,
            deadline=self.deadline,
            worker_bytes_prior=self.worker_bytes_guess(),
        )
        found = window.measurement
        self.batch_bytes = max(self.batch_bytes, window.batch_bytes)
        if found.predicted_bytes > self.budget:  # measured worker memory beat the guess
            self.refused.append((config, found.predicted_bytes))
        if found.worker_bytes is not None:
            self.worker_bytes = max(self.worker_bytes or 0, found.worker_bytes)
        self.measured[config] = found
        self.bar.update(1)
        self.bar.set_postfix_str(f"{config.label}: {found.batches_per_s:.1f} batches/s")
        return found

    def climb(
        self, make: Callable[[int], LoaderConfig], start: int, high: int, min_gain: float
    ) -> None:
        """Local search over a parallelism ``n`` in ``[1, high]`` from ``start``: go up while
        it gains at least ``min_gain``; else go down while within ``min_gain`` of the best."""
        current = self.measure(make(start))
        if current is None:
            return
        best_rate = current.batches_per_s
        n, moved_up = start, False
        while n < high:
            up = min(high, n + max(1, n // 4))
            found = self.measure(make(up))
            if found is None or found.batches_per_s < best_rate * (1 + min_gain):
                break
            n, best_rate, moved_up = up, found.batches_per_s, True
        n = start
        while not moved_up and n > 1:
            down = max(1, n - max(1, n // 4))
            found = self.measure(make(down))
            if found is None or found.batches_per_s < best_rate * (1 - min_gain):
                break
            n = down

    def run(self, *, max_workers: int, min_gain: float, threads: bool, pin: bool) -> Measurement:
        """The whole search; returns the single-process baseline measurement.

        1. The baseline: ``num_workers=0`` (one dataset thread) times reading and ``step``.
        2. With a dataset thread pool: in-process threads from ``max_workers`` downwards.
        3. Workers: from the estimate ``ceil(1.2 * read time / step time)`` (capped by CPUs and
           memory), a local search; then ``prefetch_factor`` 4 (and 8 if 4 paid off), unless
           the best worker count delivers under half the best rate measured.
        4. With CUDA, the fastest configuration without ``pin_memory``.
        """
        single = 1 if threads else None
        base = self.baseline(LoaderConfig(0, None, single, pin))
        if threads and max_workers > 1:
            self.climb(lambda n: LoaderConfig(0, None, n, pin), max_workers, max_workers, min_gain)
        if max_workers >= 1:
            # Workers needed to feed the step: one worker's batch time over the step's, with
            # a margin for the variance of batch times.
            floor_s = base.wait_s / max_workers
            needed = _MARGIN * base.wait_s / max(base.step_s, floor_s)
            estimate = min(max_workers, max(1, math.ceil(needed)))
            while (
                estimate > 1
                and self.predicted(LoaderConfig(estimate, 2, single, pin)) > self.budget
            ):
                estimate -= 1
            self.climb(lambda n: LoaderConfig(n, 2, single, pin), estimate, max_workers, min_gain)
            with_workers = [m for m in self.measured.values() if m.config.num_workers]
            best_rate = max(m.batches_per_s for m in self.measured.values())
            top = max(with_workers, key=lambda m: m.batches_per_s) if with_workers else None
            if top is not None and top.batches_per_s >= _PREFETCH_MIN_SHARE * best_rate:
                for factor in (4, 8):
                    deeper = self.measure(LoaderConfig(top.config.num_workers, factor, single, pin))
                    if deeper is None or deeper.batches_per_s < top.batches_per_s * (1 + min_gain):
                        break
                    top = deeper
        if pin:  # pinning only pays if the step copies with non_blocking: measure it
            fastest = max(self.measured.values(), key=lambda m: m.batches_per_s).config
            unpinned = LoaderConfig(
                fastest.num_workers, fastest.prefetch_factor, fastest.num_threads
            )
            self.measure(unpinned)
        return base

    def choose(self, min_gain: float) -> Measurement | None:
        """Among measurements within budget and within ``min_gain`` of the fastest, the one
        with the fewest worker processes, then unpinned, then least memory, then the
        fastest; ``None`` if none is within budget.

        When that is not the fastest itself, both are measured once more (time allowing)
        and the choice is made again on the pooled windows: one noisy window must not
        decide between a configuration and a cheaper one.
        """
        chosen, fastest = self._pick(min_gain)
        if chosen is None or fastest is None or chosen is fastest:
            return chosen
        for config in (chosen.config, fastest.config):
            if time.perf_counter() + 1.5 * self.window_s > self.deadline:
                self.out_of_time = True
                break
            self.measured[config] = merge_windows(self.measured[config], self._run(config))
        return self._pick(min_gain)[0]

    def _pick(self, min_gain: float) -> tuple[Measurement | None, Measurement | None]:
        within = [m for m in self.measured.values() if m.predicted_bytes <= self.budget]
        if not within:
            return None, None
        fastest = max(within, key=lambda m: m.batches_per_s)
        near = [m for m in within if m.batches_per_s >= fastest.batches_per_s * (1 - min_gain)]
        chosen = min(
            near,
            key=lambda m: (
                m.config.num_workers,
                m.config.pin_memory,
                m.predicted_bytes,
                -m.batches_per_s,  # threads cost neither processes nor memory: fastest
            ),
        )
        return chosen, fastest


def merge_windows(first: Measurement, second: Measurement) -> Measurement:
    """Two windows of one configuration as one: rates over the total time, means weighted
    by batches, the larger memory figures."""
    n1, n2 = first.num_batches, second.num_batches
    total_s = n1 / first.batches_per_s + n2 / second.batches_per_s
    rate = (n1 + n2) / total_s
    worker_bytes = max(first.worker_bytes or 0, second.worker_bytes or 0) or None
    return Measurement(
        config=first.config,
        batches_per_s=rate,
        spread=max(abs(first.batches_per_s - second.batches_per_s) / 2, first.spread, second.spread)
        / math.sqrt(2),
        wait_s=(first.wait_s * n1 + second.wait_s * n2) / (n1 + n2),
        step_s=(first.step_s * n1 + second.step_s * n2) / (n1 + n2),
        startup_s=min(first.startup_s, second.startup_s),
        predicted_bytes=max(first.predicted_bytes, second.predicted_bytes),
        worker_bytes=worker_bytes,
        num_batches=n1 + n2,
    )
