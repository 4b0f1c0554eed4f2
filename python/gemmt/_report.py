"""What every benchmark suite shares when it reports: a progress display, the description of
the machine and build that produced the numbers, and the JSON file they are written to.

The suites (:mod:`gemmt.bench`, :mod:`gemmt.bench_linear`) import this module and never each
other's helpers, so neither depends on the other to load.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import re
from pathlib import Path
from typing import Any, Iterable

import torch

import gemmt

try:
    from tqdm import tqdm as _tqdm
except ImportError:  # pragma: no cover - optional
    _tqdm = None


def progress(items: list[Any], desc: str) -> Iterable[Any]:
    """Iterate over ``items`` with a progress bar (tqdm when installed, else a counter)."""
    if _tqdm is not None:
        return _tqdm(items, desc=desc, ncols=100)
    total = len(items)

    def gen() -> Iterable[Any]:
        for i, item in enumerate(items):
            print(f"\r{desc}: {i + 1}/{total}", end="", flush=True)
            yield item
        print()

    return gen()


def environment() -> dict[str, Any]:
    """What produced the numbers: GPU, versions, date, and how gemmt was built."""
    props = torch.cuda.get_device_properties(0)
    return {
        "device_name": props.name,
        "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gemmt": gemmt.build_info(),
    }


def slug(name: str) -> str:
    """``name`` as a lower-case file-name fragment (a GPU's name, say)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").lower()


def write(out_dir: Path, suite: str, env: dict[str, Any], records: list[dict[str, Any]],
          extra: dict[str, Any] | None = None) -> Path:
    """Write ``<out_dir>/<suite>_<gpu>_<date>.json``: the environment, the records (each
    stamped with the device, torch version and date) and ``extra`` top-level fields."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = env["date"][:10]
    path = out_dir / f"{suite}_{slug(env['device_name'])}_{stamp}.json"
    for r in records:
        for key in ("device_name", "torch_version", "date"):
            r.setdefault(key, env[key])
    payload = {"suite": suite, "environment": env, "records": records, **(extra or {})}
    path.write_text(json.dumps(payload, indent=1))
    return path


def plot_ratios(labels: list[str], series: dict[str, list[float]], title: str, path: Path,
                ylabel: str = "torch time / gemmt time") -> None:
    """Grouped bars of one ratio per label and series, with the parity line at 1.

    Raises ImportError without matplotlib (the callers print that and go on).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8.0, 0.32 * len(labels) * len(series)), 5))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        offset = (i - (len(series) - 1) / 2) * width
        ax.bar([x + offset for x in range(len(labels))], values, width=width, label=name)
    ax.axhline(1.0, color="k", ls="--", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=70)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def sections_of(sections: str, known: tuple[str, ...]) -> tuple[list[str], bool]:
    """The sections asked for (comma separated), and False after printing the choices when
    one of them is not among ``known``."""
    wanted = [s for s in sections.split(",") if s]
    unknown = set(wanted) - set(known)
    if unknown:
        print(f"unknown sections {sorted(unknown)}; choose from {', '.join(known)}")
    return wanted, not unknown
