"""The opt-in GEMM tuner (``pytorch_wrapper/gemm_tuner.h``).

Every product gemmt runs on CUDA (``gemm``, ``mm``, ``linear`` and their backward products)
normally takes the planner's schedule. With tuning on, the first time a problem (shape,
dtype, layout, alignment, epilogue, GPU) is met, its candidate schedules are timed and the
fastest one whose result matches the default plan's within rounding is kept; later calls
run it without timing. Winners are kept in memory and, when a cache file is set, in that
file, which can be shipped with a model and read back without timing anything::

    with gemmt.tune(cache="llama_h100.gemmt-tune"):   # time what is not cached yet
        model(batch)
    gemmt.tuning_cache("llama_h100.gemmt-tune")       # elsewhere: cached winners only

The environment sets the starting state: ``GEMMT_TUNE=1`` tunes, ``GEMMT_TUNE_FILE=path``
names the file (read only, unless ``GEMMT_TUNE=1``).

Timing never runs while the current stream captures a CUDA graph (the cached winner or the
default plan runs), never writes the caller's outputs (candidates run into scratch copies),
and runs one problem at a time per device.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any, Union

from gemmt import _native

__all__ = ["tune", "tuning_cache", "tuning_state", "tuning_entries", "tuning_stats",
           "reset_tuning_stats", "save_tuning_cache", "load_tuning_cache", "clear_tuning_cache"]

PathLike = Union[str, "os.PathLike[str]"]


def _path(cache: PathLike) -> str:
    path = os.fspath(cache)
    if not isinstance(path, str) or not path:
        raise ValueError(f"gemmt.tune: argument 'cache' expected a non-empty file path, got {cache!r}")
    return os.path.abspath(path)


def _configure(mode: str, path: str) -> None:
    _native.load().tuning_configure(mode, path)


class tune:
    """Sets the tuner's state; as a context manager, restores the previous one on exit.

    Args:
        enabled: time the problems not in the cache (``True``), or only run cached winners
            (``False`` with ``cache`` given) or no tuned plans at all (``False`` without it).
        cache: the cache file, read now (its entries are merged into memory; winners this
            process already runs stay) and written after each newly tuned problem. ``None``
            keeps the current file (``GEMMT_TUNE_FILE`` or an earlier call's), if any.

    ``gemmt.tune()`` alone turns tuning on for the rest of the process.
    """

    def __init__(self, enabled: bool = True, cache: PathLike | None = None) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"gemmt.tune: argument 'enabled' expected a bool, got {enabled!r}")
        native = _native.load()
        self._previous: tuple[str, str] = tuple(native.tuning_state())  # type: ignore[assignment]
        path = self._previous[1] if cache is None else _path(cache)
        mode = "tune" if enabled else ("cached" if cache is not None else "off")
        _configure(mode, path)

    def __enter__(self) -> "tune":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _configure(*self._previous)


def tuning_cache(cache: PathLike) -> tune:
    """Runs the winners cached in ``cache`` and times nothing (``tune(False, cache)``)."""
    return tune(False, cache)


def tuning_state() -> dict[str, str]:
    """The tuner's mode (``"off"``, ``"cached"`` or ``"tune"``) and cache file (``""``: none)."""
    mode, path = _native.load().tuning_state()
    return {"mode": mode, "cache": path}


def tuning_entries() -> list[dict[str, Any]]:
    """The winners in memory: device, problem key, plan and the tuned and default times (us)."""
    return [{"device": d, "problem": p, "plan": plan, "tuned_us": t, "default_us": u}
            for d, p, plan, t, u in _native.load().tuning_entries()]


def tuning_stats() -> dict[str, Any]:
    """What tuning has cost and found since the last reset.

    ``problems`` lists each tuned problem with the seconds its tuning took, the schedules
    timed, rejected (result not within rounding of the default plan's) and failed (did not
    launch), the winner and its time against the default's, and ``timed``: each schedule
    timed, the default first, as (name, us); ``seconds`` is their total.
    ``cache_hits`` counts products run with a cached winner, ``capture_skips`` untuned
    products met during CUDA-graph capture, ``untuned_cached`` untuned products met with
    tuning off but the cache on, ``tuning_skipped`` problems whose tuning gave up.
    """
    return dict(_native.load().tuning_stats())


def reset_tuning_stats() -> None:
    """Zeroes :func:`tuning_stats`."""
    _native.load().tuning_reset_stats()


def save_tuning_cache(cache: PathLike | None = None) -> bool:
    """Merges the winners in memory into ``cache`` (default: the current file).

    The file is locked, merged with its current contents, written to a temporary file in the
    same folder and renamed, so concurrent writers lose nothing. False, with a warning, when
    it cannot be written.
    """
    path = _native.load().tuning_state()[1] if cache is None else _path(cache)
    if not path:
        raise ValueError("gemmt.save_tuning_cache: no cache file is set; pass one")
    return bool(_native.load().tuning_save(path))


def load_tuning_cache(cache: PathLike) -> bool:
    """Merges ``cache`` into memory without changing the mode. False, with a warning, when it
    is corrupt, from another gemmt version or unreadable; a missing file is empty (True)."""
    return bool(_native.load().tuning_load(_path(cache)))


def clear_tuning_cache() -> None:
    """Forgets the winners in memory (files are untouched)."""
    _native.load().tuning_clear()
