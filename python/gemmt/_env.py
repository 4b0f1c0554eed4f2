"""Environment variables set for the length of a block (build settings, launch knobs)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def env_set(env: dict[str, str]) -> Iterator[None]:
    """The environment variables ``env`` set inside the block, their former values (or their
    absence) restored after it."""
    old = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
