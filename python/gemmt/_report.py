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
