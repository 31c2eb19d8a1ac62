"""`edgeocr` command line: thin wrappers over the library.

    edgeocr run INPUT... (--model ARTIFACT | --remote [ADDRESS]) [--task T | --prompt P] [--format text|json]
                         [--stream] [--out FILE.jsonl [--resume | --overwrite]] [--dpi 200] [--max-pixels N]
    edgeocr tasks [--lang en]
    edgeocr serve [ARTIFACT] [--socket PATH] [--tcp HOST:PORT --api-key-file FILE]   (the daemon, docs/daemon.md)
    edgeocr check --reference A --candidate B --data DIR                              (two precisions, page by page)
    edgeocr bench ARTIFACT | doctor [ARTIFACT] | build-engines ARTIFACT
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from edgeocr.decode import FinishReason
from edgeocr.errors import EdgeOCRError

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 128 + 2                 # SIGINT, as shells report it
EXIT_PIPE = 128 + 13                       # SIGPIPE: stdout's reader went away (`edgeocr run ... | head`)


def _pending(refs: list, state, out) -> list:
    """The pages of `refs` not yet in `out` (all of them without an output file), with the resume line on
    stderr; an empty list (and a line saying so) when nothing is left."""
    todo = [r for r in refs if state is None or r.key not in state.done]
    if state is not None and (state.kept or state.retried or state.partial_bytes):
        again = sum(r.key in state.failed for r in todo)
        print(f"resuming {out}: {state.kept} pages already done, {len(todo)} to go"
              + (f" ({state.retried} error line(s) removed; {again} of those pages run again)"
                 if state.retried else ""), file=sys.stderr)
    if not todo:
        print(f"nothing to do: all {len(refs)} pages are in {out}", file=sys.stderr)
    return todo


def _run(args) -> int:
    """`edgeocr run`, local or --remote: the same inputs, options, output file and messages."""
    from edgeocr import batchrun, pages

    if args.out and args.stream:
        return _usage("--stream prints to the terminal; it does not combine with --out")
    if args.remote and args.stream:
        return _usage("--stream is for local runs, not --remote")
    if args.stream and args.format == "json":
        return _usage("--stream prints text as it is generated; it does not combine with --format json")
    if (args.resume or args.overwrite) and not args.out:
        return _usage("--resume and --overwrite apply to an --out file")
    if args.resume and args.overwrite:
        return _usage("--resume and --overwrite exclude each other")
    if not args.dpi > 0:
        return _usage(f"--dpi must be positive, got {args.dpi:g}")
    if args.max_new_tokens < 1:
        return _usage(f"--max-new-tokens must be a positive integer, got {args.max_new_tokens}")
    if args.remote:
        from edgeocr.serve.client import address_problem
        if problem := address_problem(args.remote):
            return _usage(problem)
    if not args.remote and not args.model:
        return _usage("no model: pass --model ARTIFACT_DIR or set EDGEOCR_MODEL (or --remote for a daemon)")
    if args.ray:
        from edgeocr.distributed import run
        return run(args)
    if args.task and not args.prompt:
        from edgeocr import prompts
        from edgeocr.errors import PromptError
        try:
            prompts.task_prompt(args.task, args.lang)          # a task without a prompt in --lang: before loading
        except PromptError as e:
            return _usage(str(e).replace("lang 'zh'", "--lang zh"))
    try:
        limit = preprocess_limit(args.max_pixels)
        files = pages.list_files(args.images)
        missing = [f for f in files if not os.path.exists(f)]
        named = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        if missing and len(missing) == len(files) and not args.resume:
            return _usage(f"no such file: {named}")          # nothing to read: before the model loads
        if missing:                                  # said now; each is that page's error, the others are read
            print(f"warning: no such file: {named} (reported as failed pages; the others are read)",
                  file=sys.stderr)
        refs = pages.list_pages(files)
        state = batchrun.prepare_output(args.out, args.resume, args.overwrite) if args.out else None
    except (pages.InputPathError, batchrun.OutputError) as e:
        return _usage(str(e))
    todo = _pending(refs, state, args.out)
    if not todo:
        return EXIT_OK
    try:
        with pages.PageLoader(dpi=args.dpi, max_pixels=limit) as loader:
            return _run_pages(args, todo, loader, multi=len(refs) > 1)
    except KeyboardInterrupt:                        # before the pages started (model loading)
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def preprocess_limit(value: int | None) -> int:
    """--max-pixels, else EDGEOCR_MAX_PIXELS, else the default (edgeocr.preprocess.pixel_limit)."""
    from edgeocr import pages, preprocess
    from edgeocr.errors import ImageError

    try:
        return preprocess.pixel_limit(value)
    except ImageError as e:
        raise pages.InputPathError(str(e).replace("max_pixels", "--max-pixels")) from None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, else an error naming the value (exit 2)."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return v


def _usage(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return EXIT_USAGE


class _Interrupt:
    """SIGINT: the first stops feeding pages (those in flight finish), the second stops at once."""

    def __init__(self):
        import threading
        self.stop = threading.Event()

    def __call__(self, signum, frame) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt
        self.stop.set()
        # straight to the descriptor: the handler may run in the middle of a buffered print to stderr
        os.write(sys.stderr.fileno(), b"\ninterrupted: finishing the pages in flight (Ctrl-C again to stop now)\n")


def _run_pages(args, todo, loader, multi: bool) -> int:
    import signal
    import threading
    import time

    from tqdm import tqdm

    from edgeocr import batchrun
    from edgeocr.decode import DecodeOptions

    show_bar = (not args.no_progress and not (args.stream and args.format == "text") and sys.stderr.isatty()
                and (args.out is not None or (multi and not sys.stdout.isatty())))
    if args.remote:
        from edgeocr.serve.client import RemoteOCR
        model = RemoteOCR(args.remote, args.api_key_file)
    else:
        from edgeocr.model import OCRModel
        model = OCRModel(args.model, device=args.device, threads=args.threads, cuda_graph=_GRAPH[args.cuda_graph],
                         preprocess=args.preprocess, max_pixels=loader.max_pixels,
                         vision_ahead=_GRAPH[args.vision_ahead])
    opts = DecodeOptions(max_new_tokens=args.max_new_tokens, repetition_penalty=args.repetition_penalty)
    out = batchrun.JsonlWriter(args.out) if args.out else None
    sized = show_bar and _terminal_sized()          # else tqdm would draw nothing on a 0x0 terminal
    bar = tqdm(total=len(todo), unit="page", file=sys.stderr, disable=not show_bar,
               dynamic_ncols=sized, ncols=None if sized else 80, nrows=None if sized else 24)
    say = (lambda msg: bar.write(msg, file=sys.stderr)) if show_bar else (lambda msg: print(msg, file=sys.stderr))
    counts = {"ok": 0, "failed": 0}
    interrupt = _Interrupt()
    main_thread = threading.current_thread() is threading.main_thread()     # signal handlers live there
    previous = signal.signal(signal.SIGINT, interrupt) if main_thread else None
    t0 = time.perf_counter()

    def on_page(o: batchrun.PageOutcome) -> None:
        counts["ok" if o.ok else "failed"] += 1
        if out is not None:
            out.write(o.record())
        if not o.ok:
            say(f"error: {o.error}")
            if out is None and args.format == "json":       # one JSON line per page, failed ones included
                _print_result(args, o.record(), o.ref.label, multi)
        else:
            rec = o.record()
            if out is None:
                _print_result(args, rec, o.ref.label, multi)
            if not show_bar:
                say(_summary_line(rec, o.ref.label, remote=bool(args.remote)))
        bar.update(1)

    try:
        if args.remote:
            model.run_pages(todo, loader, on_page, task=args.task, prompt=args.prompt, lang=args.lang,
                            max_new_tokens=args.max_new_tokens, stop=interrupt.stop)
        elif args.stream and args.format == "text":
            _stream_pages(model, todo, loader, on_page, args, opts, interrupt.stop)
        else:
            batchrun.run_pages(model, todo, loader, on_page, task=args.task, prompt=args.prompt, lang=args.lang,
                               options=opts, stop=interrupt.stop)
    except KeyboardInterrupt:
        pass
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, signal.SIG_IGN)     # let the file close cleanly
        bar.close()
        if out is not None:
            out.close()
        if main_thread and not interrupt.stop.is_set():
            signal.signal(signal.SIGINT, previous)
        # interrupted: the command exits with 130 next; SIGINT stays ignored so that another Ctrl-C arriving
        # while the interpreter shuts down (joining the prepare worker) prints no traceback
    done = counts["ok"] + counts["failed"]
    secs = time.perf_counter() - t0
    if out is not None or multi:
        print(f"{done} pages in {secs:.1f} s ({done / max(secs, 1e-9):.2f} pages/s): {counts['ok']} ok, "
              f"{counts['failed']} failed" + (f" -> {args.out}" if out is not None else ""), file=sys.stderr)
    if interrupt.stop.is_set():
        left = len(todo) - done
        print(f"interrupted: {left} of {len(todo)} pages not done"
              + (f"; run again with --resume to finish {args.out}" if out is not None else ""), file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_ERROR if counts["failed"] else EXIT_OK


def _terminal_sized() -> bool:
    """Whether stderr's terminal reports its size (a bare pty, some consoles say 0x0)."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return size.columns > 0 and size.lines > 0


def _stream_pages(model, todo, loader, on_page, args, opts, stop) -> None:
    """--stream: page by page, tokens printed as they are generated."""
    import time

    from edgeocr import batchrun

    for ref in todo:
        if stop.is_set():
            return
        t0 = time.perf_counter()
        try:
            prep = model.workers.submit(lambda r: model.prepare(loader.source(r)), ref).result()
        except EdgeOCRError as e:
            on_page(batchrun.PageOutcome(ref, error=e))
            continue
        load_ms = (time.perf_counter() - t0) * 1e3 - prep.timings_ms.get("preprocess", 0.0)
        res = model.recognize(prep, task=args.task, prompt=args.prompt, lang=args.lang, options=opts,
                              on_token=lambda _t, d: (sys.stdout.write(d), sys.stdout.flush()))
        sys.stdout.write("\n")
        on_page(batchrun.PageOutcome(ref, result=res, load_ms=load_ms))


def _print_result(args, rec: dict, label: str, multi: bool) -> None:
    """Without --out: text (a `== file` header per page when there are several) or one JSON line per page,
    the same object as an --out line."""
    if args.format == "json":
        print(json.dumps(rec, ensure_ascii=False), flush=True)
    elif not args.stream:
        if multi:
            print(f"== {label}")
        print(format_text(rec), flush=True)


def format_text(rec: dict) -> str:
    """A page for the terminal: its text, or for spotting one line per box, `[x1, y1, x2, y2]  text` in
    the original image's pixels."""
    lines = rec.get("lines") or []
    if not lines:
        return rec["text"]
    width = max(len(str(v)) for ln in lines for v in ln["box"])
    return "\n".join("[" + ", ".join(f"{v:>{width}}" for v in ln["box"]) + "]  " + ln["text"] for ln in lines)


# what a page's finish reason means for its text, where the text is not whole (check.TRUNCATED's reasons)
_CUT_HINTS = {
    FinishReason.CACHE_FULL: "text cut off: the artifact's KV cache is full "
                             "(export it again with a larger --cache-len)",
    FinishReason.LENGTH: "text cut off at --max-new-tokens",
}


def _summary_line(rec: dict, label: str, remote: bool = False) -> str:
    t = rec["timings_ms"]
    if rec["finish_reason"] == FinishReason.BLANK:
        return f"[{label}] blank page (no ink): empty result, no token decoded"
    hint = _CUT_HINTS.get(rec["finish_reason"])     # a FinishReason hashes as its value: str records look up too
    return (f"[{label}] {rec['generated_tokens']} tokens, finish={rec['finish_reason']}, total {t['total']:.0f} ms "
            f"(vision {t.get('vision', 0):.0f}, prefill {t.get('prefill', 0):.0f}, "
            f"{t.get('per_token', 0):.2f} ms/token)" + (" (remote)" if remote else "") + (f"; {hint}" if hint else ""))


def _serve(args) -> int:
    from edgeocr.serve import serve
    from edgeocr.serve_config import ConfigError, resolve

    try:
        cfg = resolve(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    logging.getLogger().setLevel(getattr(logging, cfg.log_level.upper(), logging.INFO))
    try:
        return serve(cfg)
    except (EdgeOCRError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR


def _bench(args) -> int:
    from edgeocr import bench

    try:
        if args.pages:
            images = [args.image] * args.pages if args.image else \
                [bench.synthetic_page(i, (1024, 1024)) for i in range(args.pages)]
            r = bench.bench_pages(args.artifact, images, device=args.device, tokens=args.tokens, task=args.task,
                                  preprocess=args.preprocess, vision_ahead=_GRAPH[args.vision_ahead],
                                  threads=args.threads, cuda_graph=_GRAPH[args.cuda_graph])
            print(bench.format_pages(r))
            if args.json:
                Path(args.json).write_text(json.dumps({"edgeocr": r, "transformers": None}, indent=2))
            return EXIT_OK
        image = args.image or bench.synthetic_page()
        r = bench.bench(args.artifact, image, device=args.device, tokens=args.tokens, repeats=args.repeats,
                        preprocess=args.preprocess,
                        task=args.task, threads=args.threads, cuda_graph=_GRAPH[args.cuda_graph])
    except EdgeOCRError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    if r.new_tokens < args.tokens:
        print(f"note: {r.new_tokens} tokens timed, not {args.tokens}: the artifact's KV cache holds no more "
              "after the prompt", file=sys.stderr)
    print(bench.format_table(r))
    if args.json:
        Path(args.json).write_text(bench.to_json(r))
    return EXIT_OK


_GRAPH = {"auto": None, "on": True, "off": False}


def _preprocess_arg(p) -> None:
    p.add_argument("--preprocess", choices=["exact", "fast", "device"], default=None,
                   help="exact: Pillow's bicubic like the reference; fast: reduced-scale JPEG decoding and OpenCV "
                        "resize on the host; device: resize + normalize in a graph on --device.  Default: device "
                        "with --device cuda (the faster path there), exact on the CPU")


def _graph_arg(p) -> None:
    p.add_argument("--cuda-graph", choices=list(_GRAPH), default="auto",
                   help="replay the decode step as a CUDA graph: auto (default) = on with --device cuda for "
                        "artifacts exported with --attention gqa --select-on-device")


def _vision_ahead_arg(p) -> None:
    p.add_argument("--vision-ahead", choices=list(_GRAPH), default="auto",
                   help="run each page's vision on its own thread while the other slots decode, only its prefill "
                        "pausing them (auto, the default: env EDGEOCR_VISION_AHEAD=1 turns it on, else off; measured: no "
                        "gain on the H200 with ONNX Runtime's step, 5 %% more pages/s on an H100 with the native "
                        "step; docs/batching.md, docs/perf.md section 9)")


def _pixels_arg(p) -> None:
    from edgeocr.preprocess import DEFAULT_MAX_PIXELS, MAX_PIXELS_ENV
    p.add_argument("--max-pixels", type=int, default=None, metavar="N",
                   help=f"refuse images (and rendered PDF pages) larger than N pixels, from their header before "
                        f"decoding (env {MAX_PIXELS_ENV}; default {DEFAULT_MAX_PIXELS:,})")


def main(argv: list[str] | None = None) -> int:
    from edgeocr import prompts
    from edgeocr.pages import DEFAULT_DPI

    ap = argparse.ArgumentParser(prog="edgeocr", description="HunyuanOCR at the edge.")
    ap.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    verbose = argparse.ArgumentParser(add_help=False)      # -v after the command too (`edgeocr run -v ...`)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log to stderr")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def command(name: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[verbose], **kw)

    r = command("run", help="OCR images, folders, glob patterns and PDFs",
                       description="Pages go to stdout (text, or one JSON per page), or with --out to a JSONL file, "
                                   "one line per page as it finishes, with a progress bar on a terminal. "
                                   "Exit codes: 0 all pages read, 1 a page failed (or an error), 2 usage, "
                                   "130 interrupted (Ctrl-C: pages in flight finish; again: stop now), "
                                   "141 stdout closed by its reader (e.g. piped to head).")
    r.add_argument("images", nargs="+", metavar="INPUT",
                   help="image file, PDF (each page; needs the pdf extra), folder (its images and PDFs, sorted) "
                        "or quoted glob pattern ('scans/**/*.pdf')")
    r.add_argument("--model", "-m", default=os.environ.get("EDGEOCR_MODEL"),
                   help="artifact directory (env EDGEOCR_MODEL)")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--task", "-t", choices=prompts.task_names(), help=f"official task (default {prompts.DEFAULT_TASK})")
    g.add_argument("--prompt", "-p", help="custom instruction instead of a task")
    r.add_argument("--lang", choices=["zh", "en"], default="zh", help="prompt language for --task (default zh)")
    r.add_argument("--format", "-f", choices=["text", "json"], default="text")
    r.add_argument("--stream", action="store_true", help="print tokens as they are generated (text format, no --out)")
    r.add_argument("--max-new-tokens", type=int, default=1024)
    r.add_argument("--repetition-penalty", type=float, default=None, help="default: the artifact's (its checkpoint's generation_config)")
    r.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    r.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    _graph_arg(r)
    _vision_ahead_arg(r)
    _preprocess_arg(r)
    r.add_argument("--out", "-o", metavar="FILE.jsonl",
                   help="write one JSON line per page: {file, page, text, lines, finish_reason, timings_ms, ...}, "
                        "or {file, page, error: {type, message}} for a page that failed")
    r.add_argument("--resume", action="store_true",
                   help="continue an --out file: skip pages it holds without an error, retry the others")
    r.add_argument("--overwrite", action="store_true", help="start an existing --out file over")
    r.add_argument("--dpi", type=float, default=DEFAULT_DPI, help=f"PDF rasterization (default {DEFAULT_DPI})")
    _pixels_arg(r)
    r.add_argument("--no-progress", action="store_true",
                   help="no progress bar (shown on a terminal with --out, or when stdout is redirected)")
    r.add_argument("--remote", nargs="?", const=os.environ.get("EDGEOCR_REMOTE", "unix:/run/edgeocr/edgeocr.sock"),
                   default=None, metavar="ADDRESS",
                   help="use a running daemon instead of loading the model: unix:/path.sock or http://127.0.0.1:PORT "
                        "(default unix:/run/edgeocr/edgeocr.sock; env EDGEOCR_REMOTE); the same inputs, --out and "
                        "--resume; PDF pages are rendered here")
    r.add_argument("--ray", nargs="?", const="auto" if os.environ.get("RAY_ADDRESS") else "local", default=None,
                   metavar="local|auto|ADDRESS",
                   help="spread the pages over a Ray cluster (Ray Data; the ray extra): local = a private Ray on "
                        "this machine, auto = the running cluster (RAY_ADDRESS or `ray start`), or its address; "
                        "bare --ray: auto under `ray job submit`, else local.  Needs --out (.jsonl or .parquet); "
                        "docs/distributed.md")
    r.add_argument("--ray-actors", type=int, default=None, metavar="N",
                   help="with --ray: actors recognizing pages (default: one per GPU of the cluster, else as many "
                        "--threads-thread CPU actors as fit beside a read task)")
    r.add_argument("--ray-call-pages", type=int, default=None, metavar="N",
                   help="with --ray: pages an actor recognizes per call (default 2 per artifact slot; at most the "
                        "pages divided among the actors); an actor runs 2 calls at once and the next call's pages "
                        "fill the slots this one's leave, so a read task loading as many pages, holding their pixels, "
                        "is the cost of more")
    r.add_argument("--api-key-file", default=os.environ.get("EDGEOCR_API_KEY_FILE"),
                   help="Bearer key for a TCP daemon (env EDGEOCR_API_KEY_FILE)")
    s_ = command("serve", help="run the local OCR daemon (systemd Type=notify)",
                        description="Settings come from flags, then EDGEOCR_* environment variables, then the "
                                    "config file, then defaults.")
    from edgeocr.serve_config import add_arguments
    add_arguments(s_)
    d = command("doctor", help="check Python, ONNX Runtime, GPU, TensorRT, an artifact and the daemon")
    d.add_argument("artifact", nargs="?", help="artifact directory to check")
    d.add_argument("--verify", action="store_true",
                   help="also hash every file of the artifact against its manifest (sha256)")
    d.add_argument("--remote", default=os.environ.get("EDGEOCR_REMOTE", "unix:/run/edgeocr/edgeocr.sock"),
                   help="daemon address to probe")
    b = command("bench", help="per-stage timings, tokens/s and memory (fixed output length)",
                       description="The same job on transformers, with ratios: python -m quantize bench-hf.")
    b.add_argument("artifact", help="artifact directory")
    b.add_argument("--image", help="image to use (default: a built-in synthetic page)")
    b.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="default %(default)s")
    b.add_argument("--tokens", type=positive_int, default=64,
                   help="tokens to generate, stop ids ignored, up to what the KV cache holds (default %(default)s)")
    b.add_argument("--repeats", type=positive_int, default=1, help="timed runs; the fastest is reported (default 1)")
    b.add_argument("--task", choices=prompts.task_names(), default="spotting")
    b.add_argument("--threads", type=int, default=None)
    _graph_arg(b)
    _preprocess_arg(b)
    b.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    b.add_argument("--pages", type=int, default=0, metavar="K",
                   help="many-pages mode: K pages through the artifact's slots (continuous batching); pages/s, "
                        "tokens/s and the decode step time with every slot busy")
    _vision_ahead_arg(b)
    c = command("check", help="compare two artifacts/backends page by page (e.g. FP16 vs INT8)",
                       description="Exit codes: 0 gates hold, 3 a gate failed, 1 error, 2 usage.")
    from edgeocr.check import add_arguments as add_check_arguments
    add_check_arguments(c)
    tk = command("tasks", help="list the official task prompts")
    tk.add_argument("--lang", choices=["zh", "en"], default="zh", help="prompt language (default zh)")
    tb = command("build-engines", help="build TensorRT engines for an artifact, on the target device "
                        "(experimental: the session that runs them has not yet run on a GPU)")
    tb.add_argument("artifact", help="artifact directory (masked attention; FP16, or INT8 with Q/DQ)")
    tb.add_argument("--flavour", choices=["auto", "tensorrt", "tensorrt_rtx"], default="auto",
                    help="full TensorRT (JetPack, x86) or TensorRT-RTX (RTX cards); auto tries them in that order")
    tb.add_argument("--opt-level", type=int, default=3, help="builder optimization level 0-5 (default 3)")
    tb.add_argument("--workspace-mib", type=int, default=2048)
    args = ap.parse_args(argv)
    if getattr(args, "preprocess", "") is None:
        from edgeocr.bench import default_preprocess
        args.preprocess = default_preprocess(args.device, getattr(args, "backend", "onnxruntime"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _command(args)
    except BrokenPipeError:
        # stdout's reader has gone (`edgeocr run ... | head`): stop quietly, as a tool ended by SIGPIPE does;
        # stdout goes to /dev/null so that flushing it at exit does not fail again
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return EXIT_PIPE


def _command(args) -> int:
    from edgeocr import prompts

    if args.cmd == "tasks":
        table = prompts.TASKS_EN if args.lang == "en" else prompts.TASKS_ZH
        for k in prompts.task_names():
            print(f"{k:18s} {table.get(k, '(no English prompt: --lang zh)')}")
        return EXIT_OK
    if args.cmd == "bench":
        return _bench(args)
    if args.cmd == "build-engines":
        from edgeocr.trt_engines import BuildOptions, build
        try:
            rec = build(args.artifact, BuildOptions(flavour=args.flavour, opt_level=args.opt_level,
                                                    workspace_mib=args.workspace_mib),
                        progress=lambda msg: print(msg, file=sys.stderr, flush=True))
        except EdgeOCRError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_ERROR
        for g, e in rec["engines"].items():
            print(f"{e['bytes'] / 2**20:10.2f} MiB  {e['file']}  ({e['build_seconds']:.1f} s)")
        return EXIT_OK
    if args.cmd == "check":
        from edgeocr.check import main as check_main
        return check_main(args)
    if args.cmd == "serve":
        return _serve(args)
    if args.cmd == "doctor":
        from edgeocr.doctor import doctor
        return doctor(args.artifact, args.remote, verify=args.verify)
    try:
        return _run(args)
    except EdgeOCRError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
