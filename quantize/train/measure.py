"""What a run measures about itself: page views per second and, on CUDA, how busy the GPU was.

`GpuBusy` samples the GPU's utilization (the share of time a kernel was running, as nvidia-smi reports
it) on a background thread while training runs; `RunSummary` accumulates seconds, steps and page views
over every invocation of a run (resumes included) and writes OUT/run_summary.json, so a model card can
list every run with its recipe and how well it used the machine.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
import time
from pathlib import Path

log = logging.getLogger("quantize.train")


class GpuBusy:
    """Background sampler of one GPU's utilization %, every `period` seconds while active."""

    def __init__(self, device_index: int = 0, period: float = 0.5):
        self.index, self.period = device_index, period
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._read = self._reader()
        self._thread = None

    def _reader(self):
        import torch
        try:
            torch.cuda.utilization(self.index)               # needs pynvml (or amdsmi)
            return lambda: float(torch.cuda.utilization(self.index))
        except Exception:  # noqa: BLE001 - any failure: fall back to nvidia-smi
            pass
        if shutil.which("nvidia-smi"):
            cmd = ["nvidia-smi", f"--id={self.index}", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
            return lambda: float(subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout.split()[0])
        return None

    @property
    def available(self) -> bool:
        return self._read is not None

    def start(self) -> "GpuBusy":
        if self._read is not None:
            self._thread = threading.Thread(target=self._run, name="gpu-busy", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.samples.append(self._read())
            except Exception as e:  # noqa: BLE001 - a failed read ends sampling, never the training
                log.warning("GPU utilization sampling stopped: %s", e)
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def mean(self, last: int | None = None) -> float | None:
        s = self.samples[-last:] if last else self.samples
        return round(sum(s) / len(s), 1) if s else None


class RunSummary:
    """OUT/run_summary.json: the recipe and, per invocation and in all, training seconds, steps, page
    views, page views/s and mean GPU busy %."""

    def __init__(self, path: Path, recipe: dict, device: str, device_name: str, continued: bool):
        """`continued`: this invocation resumes the run (its recipe is the first invocation's)."""
        self.path = path
        prev = json.loads(path.read_text()) if continued and path.exists() else {}
        self.data = {"recipe": prev.get("recipe", recipe), "invocations": prev.get("invocations", [])}
        self.current = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": device,
                        "device_name": device_name, "train_s": 0.0, "steps": 0, "page_views": 0,
                        "page_views_per_s": None, "gpu_busy_pct": None, "pool_s": None}
        self.data["invocations"].append(self.current)

    def update(self, *, train_s: float, steps: int, page_views: int, gpu_busy: float | None,
               pool_s: float | None = None, finished: bool = False) -> None:
        c = self.current
        c.update(train_s=round(train_s, 2), steps=steps, page_views=page_views,
                 page_views_per_s=round(page_views / train_s, 2) if train_s > 0 else None, gpu_busy_pct=gpu_busy)
        if pool_s is not None:
            c["pool_s"] = round(pool_s, 1)
        inv = self.data["invocations"]
        total_s = sum(i["train_s"] for i in inv)
        views = sum(i["page_views"] for i in inv)
        busy = [(i["gpu_busy_pct"], i["train_s"]) for i in inv if i["gpu_busy_pct"] is not None]
        self.data["total"] = {
            "train_s": round(total_s, 2), "steps": sum(i["steps"] for i in inv), "page_views": views,
            "page_views_per_s": round(views / total_s, 2) if total_s > 0 else None,
            "gpu_busy_pct": round(sum(b * s for b, s in busy) / max(1e-9, sum(s for _, s in busy)), 1) if busy else None,
            "finished": finished}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        tmp.replace(self.path)
