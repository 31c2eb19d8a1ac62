#!/usr/bin/env bash
# edgeocr beside llama.cpp on one CUDA machine in one run, per page of 256 and 1,024 new tokens (docs/perf.md
# section 20).  Needs CUDA torch, transformers and onnxruntime-gpu importable (SITE=/tmp/site first on PYTHONPATH
# if it exists) and llama.cpp's CUDA tools already built: BIN=DEST of `scripts/llamacpp_bench.sh build` (building
# them here takes about 400 s on 16 cores, more than this script leaves: run `scripts/llamacpp_bench.sh` on its
# own then).  CUDA_LIBS: where the GPU machine's CUDA 13 libraries are (default /usr/local/cuda/lib64).
#   1. the real-size architecture on random weights, FP16 export (gqa, selection in the graph, 4,096-token cache),
#      fused for CUDA, made into native-step artifacts: FP16 weights (float), 8-bit weights and embedding (int8),
#      FP16 decoder weights with 8-bit vision weights (f16v8) (scripts/gpu_realsize.sh)
#   2. `edgeocr bench` of each form with the runtime's defaults (device preprocessing), --tokens 256 (best of 3
#      pages; also with EDGEOCR_PDL=0, the step without programmatic dependent launch) and --tokens 1024 (best of
#      2), forms alternating, ROUNDS times (default 2): every page from the encoded file, stop ids ignored, plus
#      the medians of 7 one-token calls (SPECS: form setting:tokens:repeats, default "base:256:3 nopdl:256:3
#      base:1024:2")
#   3. device memory after two pages of 256 tokens, one slot (gpu_perf.py memory, the runtime's settings), the
#      CUDA kernels of a decode step of each form in PROFILE (default int8; gpu_profile.py), and 10 one-token calls
#      of each form in ADMISSION (default: int8 and f16v8, those in FORMS) on the GPU's timeline (gpu_profile.py --admission)
#   4. scripts/llamacpp_bench.sh on the same checkpoint: decode of 256 and 1,024 tokens at depth 1,093 (F16, Q8_0),
#      a 1,093-token prompt, two eval pages as two images of one llama-mtmd-cli prompt (the second image's encode
#      and prefill warm)
#   5. side_by_side.json: every figure, and per page (ms) = what each measured end to end for edgeocr; for llama.cpp
#      the warm image encode + image prefill + the new tokens at its measured mean per token
# FORMS (default "f16v8 int8 float"), ROUNDS, DEADLINE (seconds, default 560; steps that would end past it are
# skipped and logged).  Everything lands in $OUT/results.tar.gz.
set -uo pipefail
# shellcheck source=scripts/gpu_call_common.sh
source "$(dirname "$0")/gpu_call_common.sh" /tmp/work
# shellcheck source=scripts/gpu_realsize.sh
source "$(dirname "$0")/gpu_realsize.sh"
DEADLINE=${DEADLINE:-560}
[ -x "${BIN:-}/llama-bench" ] || { say "error: BIN must name llama.cpp's CUDA tools (scripts/llamacpp_bench.sh build)"; exit 2; }
FORMS=${FORMS:-f16v8 int8 float}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }

say "-- real-size FP16 export, fused for CUDA, native-step forms: $FORMS"
realsize_native_forms >> "$R/run.log" 2>&1 || { say "build failed"; exit 1; }
if [[ " $FORMS " == *" f16v8 "* ]] && [ ! -f "$F-native-f16v8/manifest.json" ]; then
  run native_f16v8 300 $PY -m quantize native-step "$F" "$F-native-f16v8" --weights float --vision int8 || exit 1
fi

# form-setting:tokens:repeats; the setting "nopdl" runs the step without programmatic dependent launch
SPECS=${SPECS:-base:256:3 nopdl:256:3 base:1024:2}
for k in $(seq 1 "${ROUNDS:-2}"); do
  for form in $FORMS; do
    for spec in $SPECS; do
      IFS=: read -r set tokens repeats <<< "$spec"
      name=$form; env=()
      [ "$set" = base ] || name=$form-$set
      [ "$set" = nopdl ] && env=(EDGEOCR_PDL=0)
      [ "$(left)" -gt 200 ] || { say "skipped bench_${name}_${tokens}_$k (deadline; llama.cpp needs ~150 s)"; continue; }
      run "bench_${name}_${tokens}_$k" 90 env ${env[@]+"${env[@]}"} $PY -m edgeocr bench "$F-native-$form" --device cuda \
        --tokens "$tokens" --repeats "$repeats" --image "$IMG" --json "$R/bench_${name}_${tokens}_$k.json"
    done
  done
done

# device memory after two pages of 256 tokens, one slot (the runtime's settings), and the kernels of a decode step
PAGES=("$ROOT"/calibration_data/eval/00000[0-1].jpg)
for form in $FORMS; do
  [ "$(left)" -gt 170 ] || { say "skipped memory_$form (deadline)"; continue; }
  run "memory_$form" 60 $PY scripts/gpu_perf.py memory "$F-native-$form" --config runtime --device cuda \
    --tokens 256 --pages 2 --image "${PAGES[@]}" --json "$R/memory_$form.json"
done
for form in ${PROFILE-int8}; do
  [ "$(left)" -gt 170 ] || { say "skipped profile_$form (deadline)"; continue; }
  run "profile_$form" 90 $PY scripts/gpu_profile.py "$F-native-$form" --steps 16 --label "$form" \
    --json "$R/profile_$form.json"
done

# one-token calls of the runtime's path on the GPU's timeline: what the host adds to the first token from pixels
if [ -z "${ADMISSION+x}" ]; then        # default: the forms of "int8 f16v8" this run built
  ADMISSION=""; for f in int8 f16v8; do [[ " $FORMS " == *" $f "* ]] && ADMISSION+=" $f"; done
fi
for form in $ADMISSION; do
  [ "$(left)" -gt 170 ] || { say "skipped admission_$form (deadline)"; continue; }
  run "admission_$form" 90 $PY scripts/gpu_profile.py "$F-native-$form" --admission 10 --image "$IMG" \
    --label "$form" --json "$R/admission_$form.json"
done

[ "$(left)" -gt 60 ] || { say "skipped llama.cpp (deadline)"; exit 1; }
run llamacpp "$(left)" env OUT="$R" WORK=/tmp/work-llamacpp CKPT="$W/real-ckpt" \
  CUDA_LIBS="${CUDA_LIBS:-/usr/local/cuda/lib64}" IMG="$ROOT/calibration_data/eval/000000.jpg,$ROOT/calibration_data/eval/000001.jpg" \
  bash scripts/llamacpp_bench.sh

$PY - "$R" <<'EOF' | tee -a "$R/run.log"
import json, statistics, sys
from pathlib import Path
R = Path(sys.argv[1])
out = {"edgeocr": {}, "llamacpp": None, "per_page_ms": {}, "memory": {}, "profile": {}, "admission": {}}
for p in sorted(R.glob("memory_*.json")):
    out["memory"][p.stem[7:]] = json.loads(p.read_text())
for p in sorted(R.glob("profile_*.json")):
    out["profile"][p.stem[8:]] = json.loads(p.read_text())
for p in sorted(R.glob("admission_*.json")):
    out["admission"][p.stem[10:]] = json.loads(p.read_text())["admission"]
for p in sorted(R.glob("bench_*.json")):
    form, tokens, k = p.stem[len("bench_"):].rsplit("_", 2)
    r = json.loads(p.read_text())["edgeocr"]
    out["edgeocr"].setdefault(form, {}).setdefault(tokens, []).append(
        {"round": int(k), "total_ms": r["total_ms"], "from_pixels_ms": r["total_ms"] - r["preprocess_ms"],
         "decode_ms_per_token": r["decode_ms_per_token"], "first_token_median": r.get("first_token_median"),
         "peak_device_mib": r.get("peak_device_mib"), "device": r["device_name"], "new_tokens": r["new_tokens"]})
for form, by_len in out["edgeocr"].items():
    for tokens, runs in by_len.items():
        out["per_page_ms"][f"edgeocr {form} {tokens}"] = {
            "from_file": [round(x["total_ms"], 1) for x in runs],
            "from_pixels": [round(x["from_pixels_ms"], 1) for x in runs]}
try:
    ll = json.loads((R / "llamacpp.json").read_text())
except Exception as e:                      # the log says why
    ll = {"error": str(e)}
out["llamacpp"] = ll
enc, dec, n_img = ll.get("mtmd_image_encode_ms") or [], ll.get("mtmd_image_prefill_ms") or [], ll.get("mtmd_images_per_run", 1)
if enc and dec and n_img >= 2 and len(enc) % n_img == 0 and len(enc) == len(dec):
    warm_enc = statistics.median(enc[n_img - 1::n_img])      # the last image of each process
    warm_dec = statistics.median(dec[n_img - 1::n_img])
    out["llamacpp_image_warm_ms"] = {"encode": warm_enc, "prefill": warm_dec}
    for row in ll.get("decode_at_depth") or []:
        if isinstance(row, dict) and row.get("n_gen"):
            kind = "F16" if "f16" in row["model"] else "Q8_0"
            out["per_page_ms"][f"llama.cpp {kind} {row['n_gen']}"] = {
                "from_pixels": round(warm_enc + warm_dec + row["n_gen"] * row["avg_ms_per_token"], 1),
                "decode_ms_per_token": round(row["avg_ms_per_token"], 4)}
if "llamacpp_image_warm_ms" not in out:
    print("no per-page llama.cpp figures: its image timings are missing or not one encode and one prefill per image")
(R / "side_by_side.json").write_text(json.dumps(out, indent=1))
print(json.dumps(out["per_page_ms"], indent=1))
EOF
