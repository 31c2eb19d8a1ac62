"""Transformers beside the runtime (toolchain: needs the [export] extra, torch and transformers).

    python -m quantize compare --reference hf:CHECKPOINT --candidate ARTIFACT --data DIR [edgeocr check options]
    python -m quantize bench-hf ARTIFACT CHECKPOINT [--pages K [--transformers-pages K]] [edgeocr bench options]

`compare` is `edgeocr check` where either side may be `hf:CHECKPOINT` (quantize.reference's transformers
implementation, driven with the runtime's inputs); same reports, gates and exit codes.  `bench-hf` runs
`edgeocr bench` (or `--pages`) and then transformers `generate` on the same image(s), prompt and number of
tokens, and prints the ratios.  The runtime (`edgeocr`) never imports this module.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from edgeocr import bench, check, prompts
from edgeocr.errors import EdgeOCRError

HF_PREFIX = "hf:"
_GRAPH = {"auto": None, "on": True, "off": False}


class TransformersSide:
    """A side of `compare` on transformers: `label`, `identity` and `run` as edgeocr.check.Runner."""

    def __init__(self, checkpoint: str, device: str = "cpu"):
        from quantize.reference import TransformersRunner

        if not (Path(checkpoint) / "config.json").is_file():
            raise EdgeOCRError(f"hf:{checkpoint}: no config.json there (expected a Hugging Face checkpoint directory)")
        self.impl = TransformersRunner(checkpoint, device)
        self.label = f"transformers:{Path(checkpoint).name}"
        self.identity = HF_PREFIX + check.hash_dir_files(Path(checkpoint), ("config.json",))

    def run(self, image, task, prompt, lang, opts):
        return self.impl.recognize(image, task=task, prompt=prompt, lang=lang, options=opts)


def open_runner(spec: str, device: str = "cpu", threads: int | None = None):
    """`hf:CHECKPOINT` -> transformers; anything else -> the runtime's artifact runner."""
    if spec.startswith(HF_PREFIX):
        return TransformersSide(spec[len(HF_PREFIX):], device)
    return check.Runner(spec, device, threads)


def bench_transformers(checkpoint: str | Path, image, tokens: int, task: str = "spotting",
                       attn: str = "sdpa", dtype: str = "bfloat16") -> dict:
    """transformers `generate` on the same letterboxed image and prompt ids, same number of tokens."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    from quantize.reference import TransformersRunner

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    runner = TransformersRunner(str(checkpoint), dev, attn=attn, dtype=dtype)
    hf = runner.model
    inputs, _ = runner.inputs(image, task)
    ii = inputs["input_ids"]

    class Clock(LogitsProcessor):
        """Called once per generated token, before it is chosen: a timestamp per step of one generate call
        (synchronized on CUDA), so first-token and per-token times come from the same run."""

        def __init__(self):
            self.t: list[float] = []

        def __call__(self, input_ids, scores):
            if dev == "cuda":
                torch.cuda.synchronize()
            self.t.append(time.perf_counter())
            return scores

    def run(n):
        clock = Clock()
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              repetition_penalty=runner.penalty, eos_token_id=None, pad_token_id=0,
                              logits_processor=LogitsProcessorList([clock]))
        if dev == "cuda":
            torch.cuda.synchronize()
        end = time.perf_counter()
        return t, end, clock.t, out.shape[1] - ii.shape[1]

    run(2)  # warm-up
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start, end, steps, n = run(tokens)
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev == "cuda" else None
    return {"attn": attn, "dtype": dtype, "first_token_ms": (steps[0] - start) * 1e3, "total_ms": (end - start) * 1e3,
            "new_tokens": n, "decode_ms_per_token": (steps[-1] - steps[0]) * 1e3 / max(len(steps) - 1, 1),
            "peak_device_mib": peak}



def bench_transformers_pages(checkpoint: str | Path, images: list, tokens: int, batch: int, task: str = "spotting",
                             attn: str = "sdpa", dtype: str = "bfloat16") -> dict:
    """transformers batched `generate` (left padding where prompts differ) on the same pages and prompt,
    `batch` pages per call, exactly `tokens` new tokens each."""
    import torch

    from quantize.reference import TransformersRunner, inputs

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    runner = TransformersRunner(str(checkpoint), dev, attn=attn, dtype=dtype)
    hf = runner.model
    runner.model.generation_config.pad_token_id = runner.stop_ids[0]

    def batch_inputs(imgs):
        per = [runner.page(im, task) for im in imgs]
        ids = [list(p[1]) for p in per]
        width = max(map(len, ids))
        pad = runner.stop_ids[0]
        padded = np.array([[pad] * (width - len(i)) + i for i in ids], np.int64)       # left padding
        x = inputs(hf, np.concatenate([p[0] for p in per]), padded)
        x["attention_mask"] = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids], device=hf.device)
        return x

    def run(imgs):
        x = batch_inputs(imgs)
        with torch.no_grad():
            out = hf.generate(**x, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                              repetition_penalty=runner.penalty, eos_token_id=None)
        return out.shape[1] - x["input_ids"].shape[1]

    run(images[:1])      # warm-up
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(images), batch):
        chunk = images[i:i + batch]
        assert run(chunk) == tokens
        n += len(chunk)
    if dev == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"attn": attn, "dtype": dtype, "batch": batch, "pages": n, "new_tokens_per_page": tokens, "wall_s": wall,
            "pages_per_s": n / wall, "tokens_per_s": n * tokens / wall,
            "peak_device_mib": torch.cuda.max_memory_allocated() / 2**20 if dev == "cuda" else None}


def _bench_args(ap) -> None:
    ap.add_argument("artifact", help="artifact directory (timed by edgeocr.bench)")
    ap.add_argument("checkpoint", help="Hugging Face checkpoint directory (timed by transformers generate)")
    ap.add_argument("--image", help="image to use (default: a built-in synthetic page)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="edgeocr's device (transformers: cuda "
                    "when torch sees a GPU)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens to generate on both sides (stop ids ignored)")
    ap.add_argument("--repeats", type=int, default=1, help="edgeocr's timed runs; the fastest is reported")
    ap.add_argument("--task", choices=prompts.task_names(), default="spotting")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--preprocess", choices=["exact", "fast", "device"], default=None,
                    help="edgeocr's preprocessing path (default: as edgeocr bench)")
    ap.add_argument("--cuda-graph", choices=list(_GRAPH), default="auto",
                    help="edgeocr's decode step as a CUDA graph (as edgeocr bench; default auto)")
    ap.add_argument("--pages", type=int, default=0, metavar="K",
                    help="many-pages mode: K pages through the artifact's slots, and transformers' batched generate "
                         "(batch = the artifact's slots)")
    ap.add_argument("--vision-ahead", choices=list(_GRAPH), default="auto",
                    help="with --pages: each page's vision on a worker thread while the other slots decode (as "
                         "edgeocr bench; default auto = EDGEOCR_VISION_AHEAD, off when unset)")
    ap.add_argument("--transformers-pages", type=int, default=0, metavar="K",
                    help="with --pages: time transformers on the first K pages only")
    ap.add_argument("--attn", default="sdpa", help="transformers attention implementation (default sdpa)")
    ap.add_argument("--dtype", default="bfloat16", help="transformers dtype (default bfloat16)")
    ap.add_argument("--json", metavar="FILE", help="also write both sides' figures as JSON")


def bench_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m quantize bench-hf",
                                 description="edgeocr bench and transformers generate on the same job, with ratios")
    _bench_args(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not (Path(args.checkpoint) / "config.json").is_file():
        print(f"error: {args.checkpoint}: no config.json there (expected a Hugging Face checkpoint directory)",
              file=sys.stderr)
        return 2
    try:
        if args.pages:
            images = [args.image] * args.pages if args.image else \
                [bench.synthetic_page(i, (1024, 1024)) for i in range(args.pages)]
            r = bench.bench_pages(args.artifact, images, device=args.device, tokens=args.tokens, task=args.task,
                                  threads=args.threads, preprocess=args.preprocess,
                                  cuda_graph=_GRAPH[args.cuda_graph], vision_ahead=_GRAPH[args.vision_ahead])
            hf = bench_transformers_pages(args.checkpoint, images[:args.transformers_pages or None], args.tokens,
                                          r["slots"], args.task, args.attn, args.dtype)
            print(bench.format_pages(r, hf))
            if args.json:
                Path(args.json).write_text(json.dumps({"edgeocr": r, "transformers": hf}, indent=2))
            return 0
        image = args.image or bench.synthetic_page()
        r = bench.bench(args.artifact, image, device=args.device, tokens=args.tokens, repeats=args.repeats,
                        task=args.task, threads=args.threads, preprocess=args.preprocess,
                        cuda_graph=_GRAPH[args.cuda_graph])
        hf = bench_transformers(args.checkpoint, image, args.tokens, args.task, args.attn, args.dtype)
    except EdgeOCRError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(bench.format_table(r, hf))
    if args.json:
        Path(args.json).write_text(bench.to_json(r, hf))
    return 0


def compare_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m quantize compare",
                                 description="edgeocr check where either side may be hf:CHECKPOINT (transformers). "
                                             "Exit codes: 0 gates hold, 3 a gate failed, 1 error, 2 usage.")
    check.add_arguments(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return check.main(args, open_runner)
