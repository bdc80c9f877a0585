"""The result of :func:`fastdata.autotune`: recommendation, measurements, rendering."""

from __future__ import annotations

import html
import importlib
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader

from fastdata._optional import import_optional
from fastdata._system import format_bytes
from fastdata.tune._measure import LoaderConfig, Measurement, make_loader

# Why the search stopped where it did (``TuneResult.limited_by``).
LIMITS = ("consumer", "cpus", "memory", "no-gain", "time-budget")


@dataclass(repr=False)
class TuneResult:
    """What :func:`fastdata.autotune` measured and recommends.

    Use ``DataLoader(dataset, **result.loader_kwargs)`` after setting the attributes in
    ``result.dataset_kwargs`` on the dataset, or simply ``result.make_loader(dataset)``.

    Attributes:
        recommended: The configuration to use.
        measurements: Every configuration measured, in the order it was tried.
        batch_size: The batch size tuned for.
        batch_bytes: Bytes of one batch (tensors and arrays).
        worker_bytes: Largest unique memory of one worker process seen, bytes (``None`` if
            no worker configuration was measured).
        budget_bytes: The host memory budget, bytes.
        max_workers: The most workers (or threads) the search could use.
        limited_by: Why the search stopped: ``"consumer"`` (the step is the bound),
            ``"cpus"`` (no more usable CPUs), ``"memory"`` (the budget), ``"no-gain"`` (more
            workers stopped paying off) or ``"time-budget"``.
        explanation: One paragraph saying why this is the recommendation.
        wall_time_s: How long the search took, seconds.
        from_cache: The result was loaded from the cache rather than measured now (its
            explanation then says so, and when it was measured).
        extra_kwargs: The caller's own DataLoader arguments (``collate_fn``, ``sampler`` …),
            kept in :attr:`loader_kwargs`.
    """

    recommended: LoaderConfig
    measurements: list[Measurement]
    batch_size: int
    batch_bytes: int
    worker_bytes: int | None
    budget_bytes: int
    max_workers: int
    limited_by: str
    explanation: str
    wall_time_s: float
    from_cache: bool = False
    extra_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)

    # -- the recommendation ------------------------------------------------------------
    @property
    def num_workers(self) -> int:
        return self.recommended.num_workers

    @property
    def prefetch_factor(self) -> int | None:
        return self.recommended.prefetch_factor

    @property
    def pin_memory(self) -> bool:
        return self.recommended.pin_memory

    @property
    def persistent_workers(self) -> bool:
        """Keep workers between epochs: always worth it when there are workers."""
        return self.recommended.num_workers > 0

    @property
    def num_threads(self) -> int | None:
        """The dataset's ``num_threads`` to set, or ``None`` when it has no thread pool."""
        return self.recommended.num_threads

    @property
    def best(self) -> Measurement:
        """The measurement of the recommended configuration."""
        return next(m for m in self.measurements if m.config == self.recommended)

    @property
    def loader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``DataLoader(dataset, **loader_kwargs)``: ``batch_size``,
        the tuned settings and the caller's own arguments (``collate_fn``, ``sampler`` …)."""
        kwargs: dict[str, Any] = {"batch_size": self.batch_size}
        kwargs.update(self.extra_kwargs)
        kwargs.update(self.recommended.loader_kwargs(persistent_workers=self.persistent_workers))
        return kwargs

    @property
    def dataset_kwargs(self) -> dict[str, Any]:
        """Attributes to set on the dataset before building the loader, e.g.
        ``{"num_threads": 4}``; empty when the dataset has no such setting."""
        if self.recommended.num_threads is None:
            return {}
        return {"num_threads": self.recommended.num_threads}

    def make_loader(self, dataset: Any) -> DataLoader:
        """Set :attr:`dataset_kwargs` on ``dataset`` and return its tuned DataLoader."""
        for name, value in self.dataset_kwargs.items():
            setattr(dataset, name, value)
        return make_loader(dataset, **self.loader_kwargs)

    # -- rendering ----------------------------------------------------------------------
    def _rows(self) -> list[tuple[str, str, str, str, str, str]]:
        rows = []
        for m in self.measurements:
            mark = "*" if m.config == self.recommended else ""
            rows.append(
                (
                    mark,
                    m.config.label,
                    f"{m.batches_per_s:.1f} ± {m.spread:.1f}",
                    f"{m.batches_per_s * self.batch_size:,.0f}",
                    f"{m.wait_s * 1e3:.1f}",
                    format_bytes(m.predicted_bytes),
                )
            )
        return rows

    _HEADER = ("", "configuration", "batches/s", "samples/s", "wait ms", "memory")

    def table(self) -> str:
        """The measurements as a plain-text table; ``*`` marks the recommendation."""
        rows = [self._HEADER, *self._rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self._HEADER))]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
        ]
        return "\n".join(line.rstrip() for line in lines)

    def __str__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.recommended_settings().items())
        cached = " (from cache)" if self.from_cache else ""
        return f"{self.table()}\n\nrecommended{cached}: {settings}\n{self.explanation}"

    def __repr__(self) -> str:
        # One line: the REPL shows this; print() and notebooks show the table.
        best = self.best
        cached = ", from_cache=True" if self.from_cache else ""
        return (
            f"TuneResult(recommended={self.recommended.label!r}, "
            f"batches_per_s={best.batches_per_s:.1f}, batch_size={self.batch_size}, "
            f"limited_by={self.limited_by!r}, measured={len(self.measurements)}{cached})"
        )

    def recommended_settings(self) -> dict[str, Any]:
        """The tuned settings only (loader and dataset), without the caller's arguments."""
        settings = self.recommended.loader_kwargs(persistent_workers=self.persistent_workers)
        settings.update(self.dataset_kwargs)
        return settings

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self._HEADER[1:])
        body = []
        for mark, *cells in self._rows():
            style = ' style="font-weight:bold;background:#e8f4e8"' if mark else ""
            body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells))
        settings = ", ".join(
            f"<code>{html.escape(f'{k}={v!r}')}</code>"
            for k, v in self.recommended_settings().items()
        )
        cached = " (from cache)" if self.from_cache else ""
        return (
            f"<div><p><b>fastdata.autotune</b>{cached}: {settings}</p>"
            f"<p>{html.escape(self.explanation)}</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
        )

    def plot(self, ax: Any = None) -> Any:
        """Throughput (with its spread) against workers or threads; needs matplotlib.

        Args:
            ax: A matplotlib ``Axes`` to draw on; a new figure's when ``None``.

        Returns:
            The ``Axes`` drawn on.
        """
        import_optional("matplotlib", "TuneResult.plot()")
        plt = importlib.import_module("matplotlib.pyplot")
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 4))
        series: dict[str, list[Measurement]] = {}
        for m in self.measurements:
            if m.config.num_workers > 0:
                name = f"workers, prefetch {m.config.prefetch_factor}"
            else:
                name = "in-process threads" if m.config.num_threads else "in-process"
            series.setdefault(name, []).append(m)
        for name, points in series.items():
            points.sort(key=_parallelism)
            ax.errorbar(
                [_parallelism(p) for p in points],
                [p.batches_per_s for p in points],
                yerr=[p.spread for p in points],
                marker="o",
                capsize=3,
                label=name,
            )
        best = self.best
        ax.scatter(
            [_parallelism(best)],
            [best.batches_per_s],
            s=200,
            facecolors="none",
            edgecolors="red",
            label="recommended",
        )
        ax.set_xlabel("worker processes (or in-process threads)")
        ax.set_ylabel("batches/s")
        ax.set_title(f"autotune, batch size {self.batch_size}")
        ax.legend()
        return ax

    # -- persistence ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (without the caller's DataLoader arguments, which may not be)."""
        return {
            "recommended": self.recommended.to_dict(),
            "measurements": [m.to_dict() for m in self.measurements],
            "batch_size": self.batch_size,
            "batch_bytes": self.batch_bytes,
            "worker_bytes": self.worker_bytes,
            "budget_bytes": self.budget_bytes,
            "max_workers": self.max_workers,
            "limited_by": self.limited_by,
            "explanation": self.explanation,
            "wall_time_s": self.wall_time_s,
        }

    @classmethod
    def from_dict(
        cls,
        data: dict[str, Any],
        *,
        extra_kwargs: dict[str, Any] | None = None,
        from_cache: bool = False,
    ) -> TuneResult:
        fields = dict(data)
        cached_at = fields.pop("cached_at", None)
        fields["recommended"] = LoaderConfig(**fields["recommended"])
        fields["measurements"] = [Measurement.from_dict(m) for m in fields["measurements"]]
        if from_cache:
            when = f" (measured {cached_at})" if cached_at else ""
            fields["explanation"] = (
                f"Loaded from the autotune cache{when}: nothing was measured now; pass "
                f"cache=False (the command: leave out --cache) to measure again. "
                f"{fields['explanation']}"
            )
        return cls(**fields, from_cache=from_cache, extra_kwargs=dict(extra_kwargs or {}))


def _parallelism(m: Measurement) -> int:
    """x position in the plot: workers, else in-process threads, else 0."""
    return m.config.num_workers or (m.config.num_threads or 0)
