"""`edgeocr bench` on CPU with a tiny artifact, so the benchmark cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_cpu_with_transformers_comparison(art_a, ckpt_a, tmp_path):
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "edgeocr", "bench", str(art_a), "--tokens", "12", "--json", str(out),
                        "--compare-transformers", str(ckpt_a)], capture_output=True, text=True, timeout=600)
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
