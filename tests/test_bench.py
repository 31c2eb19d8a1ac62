"""`edgeocr bench` and `python -m quantize bench-hf` on CPU with a tiny artifact, so the benchmark cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_cpu_with_transformers_comparison(art_a, ckpt_a, tmp_path):
    """`edgeocr bench` alone (the runtime, no transformers), then `python -m quantize bench-hf`: the same
    figures beside transformers generate on the same image and prompt, with ratios."""
    out = tmp_path / "e.json"
    r = subprocess.run([sys.executable, "-m", "edgeocr", "bench", str(art_a), "--tokens", "4", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    j = json.loads(out.read_text())
    assert j["edgeocr"]["new_tokens"] == 4 and j["transformers"] is None and "x)" not in r.stdout
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "quantize", "bench-hf", str(art_a), str(ckpt_a), "--tokens", "12",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    j = json.loads(out.read_text())
    e = j["edgeocr"]
    assert e["new_tokens"] == 12 and e["backend"] == "onnxruntime-cpu" and e["prompt_tokens"] > 1058
    for k in ("vision_ms", "prefill_ms", "first_token_ms", "decode_ms_per_token", "tokens_per_s", "peak_rss_mib"):
        assert e[k] > 0, k
    assert set(e["decode_ms_by_position"]) == {"first_quarter", "middle", "last_quarter"}
    assert e["kv_cache_mib"] > 0 and e["decoder_weight_mib"] > 0
    hf = j["transformers"]
    assert hf["new_tokens"] == 12 and hf["decode_ms_per_token"] > 0
    assert "decode per token" in r.stdout and "x)" in r.stdout


def test_bench_pages_with_transformers_batched(ckpt_a, tmp_path):
    """`python -m quantize bench-hf --pages K` on a 3-slot artifact: K pages x N tokens through edgeocr's slots,
    pages/s and the all-busy step time, and transformers' batched generate (batch = slots) on the same pages in
    the same run; each page's vision ahead on the worker thread (--vision-ahead on)."""
    from conftest import _export
    art = _export(ckpt_a, tmp_path / "s3", slots=3, attention="gqa", select_on_device=True)
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-m", "quantize", "bench-hf", str(art), str(ckpt_a), "--pages", "5",
                        "--tokens", "6", "--json", str(out), "--transformers-pages", "3", "--vision-ahead", "on"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    j = json.loads(out.read_text())
    e, hf = j["edgeocr"], j["transformers"]
    assert e["slots"] == 3 and e["pages"] == 5 and e["new_tokens_per_page"] == 6
    assert e["pages_per_s"] > 0 and e["step_ms_all_slots_busy"] > 0 and e["kv_mib_per_slot"] > 0
    assert e["vision_ahead"] is True and e["vision_ms_mean"] > 0 and e["prefill_ms_mean"] > 0
    assert e["letterbox_ms_mean"] == 0                          # the host path letterboxes before admission
    assert abs(e["tokens_per_s"] - 6 * e["pages_per_s"]) < 1e-6 * e["tokens_per_s"]
    assert hf["batch"] == 3 and hf["pages"] == 3 and hf["pages_per_s"] > 0
    assert "pages/s" in r.stdout and "x" in r.stdout.splitlines()[-1]


def test_bench_hf_names_a_missing_checkpoint(art_a, tmp_path):
    r = subprocess.run([sys.executable, "-m", "quantize", "bench-hf", str(art_a), str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no config.json" in r.stderr and str(tmp_path) in r.stderr


def test_preprocess_defaults_to_the_device_path_on_cuda(monkeypatch):
    """`edgeocr bench` / `recognize` without --preprocess: the device graph on CUDA (measured the faster path
    there), the exact reference path on the CPU; a named path is kept."""
    from edgeocr import bench, cli

    seen = []

    def fake_bench(artifact, image, device="cpu", preprocess=None, **kw):
        seen.append((device, preprocess))
        raise SystemExit(0)

    monkeypatch.setattr(bench, "bench", fake_bench)
    for argv in (["--device", "cuda"], ["--device", "cpu"], ["--device", "cuda", "--preprocess", "exact"]):
        try:
            cli.main(["bench", "artifact", *argv])
        except SystemExit:
            pass
    assert seen == [("cuda", "device"), ("cpu", "exact"), ("cuda", "exact")]
    assert bench.default_preprocess("cuda") == "device" and bench.default_preprocess("cpu") == "exact"


def test_bench_first_token_medians(art_a):
    """first_token_runs: one-token calls after the timed page, their medians beside it (from the file, and its
    parts), printed in the table; none by default on the CPU."""
    from conftest import make_image
    from edgeocr.bench import bench, format_table
    img = make_image(5, (500, 700))
    r = bench(art_a, img, tokens=2, first_token_runs=3)
    m = r.first_token_median
    assert m["runs"] == 3 and m["from_file_ms"] > m["vision_ms"] > 0 and m["prefill_ms"] > 0
    assert max(m["vision_ms"], m["prefill_ms"]) < m["from_pixels_ms"] < m["from_file_ms"]    # call by call
    assert m["letterbox_ms"] == 0 and "letterbox" not in format_table(r)         # the exact path: on the host
    assert "median of 3 calls" in format_table(r)
    # the device path (its preprocessing graph on the CPU here): the letterbox at admission is preprocessing
    from edgeocr.bench import bench_pages, format_pages
    p = bench_pages(art_a, [img, make_image(6)], tokens=2, preprocess="device")
    assert p["letterbox_ms_mean"] > 0 and "device letterbox" in format_pages(p)
    d = bench(art_a, img, tokens=2, first_token_runs=3, preprocess="device")
    m = d.first_token_median
    assert 0 < m["letterbox_ms"] < m["preprocess_ms"] and "device letterbox" in format_table(d)
    assert max(m["vision_ms"], m["prefill_ms"]) < m["from_pixels_ms"] < m["from_file_ms"]
    assert d.first_token_ms - d.preprocess_ms >= d.vision_ms + d.prefill_ms          # from pixels: no letterbox
    assert bench(art_a, img, tokens=2).first_token_median is None


def test_the_flavour_names_the_cuda_graphs_replayed():
    """On CUDA the bench's flavour line says whether prefills and the vision graph replay CUDA graphs (they change
    the first token by milliseconds and device memory by hundreds of MiB); on the CPU it says nothing of them."""
    from types import SimpleNamespace

    from edgeocr.bench import replay_label
    cuda = SimpleNamespace(device="cuda", prefill_graph=True, vision_graph=False)
    assert replay_label(cuda) == ", prefill / vision CUDA graphs on / off"
    assert replay_label(SimpleNamespace(device="cpu", prefill_graph=False, vision_graph=False)) == ""
    assert replay_label(SimpleNamespace(name="tensorrt")) == ""
