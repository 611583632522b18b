"""Sampling profiles of the running processes (py-spy), summarized as their top functions.

Used by `python -m bench run --profile`: where a target is missed, the results say which
functions the time went to (self time = the sampled frame itself; inclusive = anywhere on the
stack), so the owner of that code can act on it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from producers.settings import REPO_ROOT

__all__ = ["Recording", "py_spy_path", "summarize"]

OUR_PACKAGES = {"producers", "stream_processors", "projections", "api", "infra"}


def py_spy_path() -> str | None:
    return shutil.which("py-spy") or shutil.which(str(Path(sys.executable).parent / "py-spy"))


class Recording:
    """`py-spy record` of one pid for `seconds`, raw (collapsed stacks) output; a no-op without py-spy."""

    def __init__(self, pid: int, seconds: float, out: Path) -> None:
        self.out = out
        exe = py_spy_path()
        self.proc: subprocess.Popen | None = None
        if exe:
            out.parent.mkdir(parents=True, exist_ok=True)
            self.proc = subprocess.Popen(
                [
                    exe,
                    "record",
                    "--pid",
                    str(pid),
                    "-d",
                    str(int(seconds)),
                    "-f",
                    "raw",
                    "-o",
                    str(out),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def wait(self, top: int = 12) -> dict[str, Any] | None:
        if self.proc is None:
            return None
        self.proc.wait(timeout=600)
        return summarize(self.out, top) if self.out.exists() else None


def _frame(f: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)": one entry per function, not per line
    name, _, loc = f.partition(" (")
    file = loc.rsplit(":", 1)[0].rsplit("/", 2)[-2:]
    return f"{name} ({'/'.join(file)})"


def summarize(raw: Path, top: int = 12) -> dict[str, Any]:
    """Top functions by self and by inclusive share of samples from a py-spy raw file."""
    self_t: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";") if f]
        if frames:
            self_t[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
        for f in {_frame(f) for f in stack.split(";") if _ours(f)}:
            ours[f] += n
    pct = lambda n: round(100 * n / total, 1) if total else 0.0  # noqa: E731
    return {
        "samples": total,
        "top_self_pct": [(f, pct(n)) for f, n in self_t.most_common(top)],
        "top_inclusive_pct": [(f, pct(n)) for f, n in incl.most_common(top * 3) if pct(n) < 99.5][:top],
        "top_ours_inclusive_pct": [(f, pct(n)) for f, n in ours.most_common(top)],
    }


def _ours(frame: str) -> bool:
    """A frame of this repository's code (not the venv, not the standard library)."""
    loc = frame.partition(" (")[2]
    if loc.startswith(str(REPO_ROOT)):
        loc = loc[len(str(REPO_ROOT)) + 1 :]
    # py-spy shortens paths relative to sys.path, so a library's frame also looks relative: match our packages
    return loc.split("/", 1)[0] in OUR_PACKAGES and "/cli.py" not in loc and not loc.startswith("infra/cli.py")
