#!/usr/bin/env bash
# llama.cpp on the same GPU and the same real-size random-weight checkpoint as edgeocr's GPU benches, for the
# per-token and per-page comparisons in docs/perf.md.  The llama.cpp source is the copy bundled in the
# llama-cpp-python 0.3.36 sdist (PyPI), stripped to what the build and the converter need (`prepare`, run once
# off the GPU).
#
#   scripts/llamacpp_bench.sh prepare SDIST.tar.gz DEST    strip the sdist's vendor/llama.cpp into DEST
#   scripts/llamacpp_bench.sh build SRC CUDA_ROOT DEST     build the CUDA tools for sm_90 (H100 / H200) on any x86
#                                                           machine with a CUDA toolkit at CUDA_ROOT (no GPU needed:
#                                                           NVIDIA's nvcc, cudart, cuBLAS and CCCL wheels laid out as
#                                                           one root do); the tools and their libraries into DEST
#   scripts/llamacpp_bench.sh                               on a CUDA machine: build (or BIN=DEST from `build`, with
#                                                           CUDA_LIBS= the folder of that machine's CUDA 13
#                                                           libraries, e.g. /usr/local/cuda/lib64), convert, bench
#   scripts/llamacpp_bench.sh --cpu                         the same with a CPU build (checks the script; with
#                                                           CKPT=a small checkpoint, DEPTH=64 N_TOKENS=8 it runs in minutes)
#                                                           NATIVE=ON: built for this CPU (AVX512 where it has it);
#                                                           THREADS=N: -t N for every tool; POLL=0: no busy
#                                                           polling (--poll 0); MTMD_RUNS (default 3)
#
# On a CUDA machine: builds llama-bench and llama-mtmd-cli with -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
# (JOBS parallel jobs, default all cores) unless BIN names tools built by `build`, converts the checkpoint (CKPT;
# made with quantize.realsize when absent) with llama.cpp's convert_hf_to_gguf.py through scripts/llamacpp_convert.py:
# the text decoder in F16 and Q8_0 and the vision encoder + projector (mmproj) in F16, then runs
#   llama-bench -n 256,1024 -d 1093 -ngl 99 -fa 1 -p 0  decode at the depth of edgeocr's prompt, F16 and Q8_0
#                                                       (N_TOKENS: the lengths, comma-separated)
#   llama-bench -p 1093 -n 0 -ngl 99 -fa 1             a 1,093-token prompt
#   llama-mtmd-cli ... --image P,Q -n 1    (x MTMD_RUNS) two eval pages as two images of one prompt: the first
#                                          image's encode and prefill are cold (a fresh process), the second's
#                                          warm (prefilled after the first's tokens)
# Results in $OUT: llamacpp.json (everything) and llamacpp.log.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

if [ "${1:-}" = prepare ]; then
  SDIST=${2:?sdist .tar.gz}; DEST=${3:?destination directory}
  tmp=$(mktemp -d); tar xzf "$SDIST" -C "$tmp"
  src=$(echo "$tmp"/llama_cpp_python-*/vendor/llama.cpp)
  [ -f "$src/CMakeLists.txt" ] || { echo "error: $SDIST has no vendor/llama.cpp" >&2; exit 2; }
  rm -rf "$DEST"; mkdir -p "$(dirname "$DEST")"; mv "$src" "$DEST"; rm -rf "$tmp"
  # not needed to build llama-bench / llama-mtmd-cli or to convert: docs, test vocabularies, tests, examples,
  # the server and its web UI, sample media, and the ggml backends other than CPU and CUDA
  ( cd "$DEST" && rm -rf docs models tests examples pocs benches media app skills ci .github .devops \
      tools/ui tools/server tools/cli tools/mtmd/test-2.mp3 tools/mtmd/test-3.mp4 build-xcframework.sh &&
    for b in ggml/src/ggml-*/; do case $b in *ggml-cpu/|*ggml-cuda/|*ggml-blas/) ;; *) rm -rf "$b";; esac; done )
  echo "stripped llama.cpp in $DEST ($(du -sh "$DEST" | cut -f1))"
  exit 0
fi

if [ "${1:-}" = build ]; then
  SRC=${2:?llama.cpp source (from prepare)}; CUDA_ROOT=${3:?CUDA toolkit root}; DEST=${4:?destination directory}
  B=${BUILD:-$(mktemp -d)}
  L=$CUDA_ROOT/lib64; [ -d "$L" ] || L=$CUDA_ROOT/lib            # a toolkit's lib64, or the wheels' lib
  # no GPU driver here: the tools link against the toolkit's driver stub (lib/stubs/libcuda.so, found under its
  # soname too); GGML_NATIVE=OFF: the CPU backend must run on the GPU machine's CPU, not only this one's
  if [ -e "$L/stubs/libcuda.so" ] && [ ! -e "$L/stubs/libcuda.so.1" ]; then
    ln -s libcuda.so "$L/stubs/libcuda.so.1" || { echo "error: cannot add $L/stubs/libcuda.so.1 (the stub's soname)" >&2; exit 1; }
  fi
  PATH=$CUDA_ROOT/bin:$PATH cmake -S "$SRC" -B "$B" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$CUDA_ROOT/bin/nvcc" -DCUDAToolkit_ROOT="$CUDA_ROOT" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$L:$L/stubs" \
    -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -Wno-dev || exit 1
  PATH=$CUDA_ROOT/bin:$PATH cmake --build "$B" -j "${JOBS:-$(nproc)}" --target llama-bench llama-mtmd-cli || exit 1
  mkdir -p "$DEST/src" && cp -a "$B"/bin/llama-bench "$B"/bin/llama-mtmd-cli "$B"/bin/*.so* "$DEST"/ || exit 1
  strip --strip-unneeded "$DEST"/llama-* "$DEST"/*.so* 2>/dev/null
  # the OpenMP runtime of this compiler too: the GPU machine's may sit outside the loader's path
  for l in $(LD_LIBRARY_PATH=$DEST ldd "$DEST"/llama-bench "$DEST"/*.so* 2>/dev/null | awk '/libgomp/ {print $3}' | sort -u); do
    cp -L "$l" "$DEST"/
  done
  # and what the converter needs (scripts/llamacpp_convert.py), so that DEST alone serves the bench
  cp -a "$SRC"/convert_hf_to_gguf.py "$SRC"/conversion "$SRC"/gguf-py "$DEST/src"/ || exit 1
  echo "llama.cpp CUDA tools in $DEST ($(du -sh "$DEST" | cut -f1)); on the GPU machine: BIN=$DEST, its CUDA 13 libraries on LD_LIBRARY_PATH"
  exit 0
fi

MODE=gpu; [ "${1:-}" = --cpu ] && MODE=cpu
cd "$ROOT"
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$([ -d "$SITE" ] && echo "$SITE:")$ROOT PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
SRC=${LLAMA_SRC:-$([ -n "${BIN:-}" ] && echo "$BIN/src" || echo "$ROOT/.carry/llama")}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${WORK:-/tmp/work-perf}; mkdir -p "$W"
CKPT=${CKPT:-$W/real-ckpt}
BUILD=${BUILD:-$W/llama-build-$MODE}
GG=$W/gguf; mkdir -p "$GG"
JOBS=${JOBS:-$(nproc)}
EVAL=$ROOT/calibration_data/eval
# GPU: two pages a process, the second image's encode and prefill warm; CPU: one (each takes seconds there)
if [ $MODE = gpu ]; then IMG=${IMG:-$EVAL/000000.jpg,$EVAL/000001.jpg}; else IMG=${IMG:-$EVAL/000000.jpg}; fi
LOG=$OUT/llamacpp.log; : > "$LOG"
R=$W/llamacpp-results; rm -rf "$R"; mkdir -p "$R"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
# timed NAME CMD... (output into the log) / timed_to NAME FILE CMD... (stdout into FILE): wall time and status recorded
timed() { local name=$1; shift; timed_to "$name" "$LOG" "$@"; }
timed_to() { local name=$1 file=$2; shift 2; local t=$(date +%s); say "-- $name"; "$@" >> "$file" 2>> "$LOG"; local rc=$?
  echo "{\"rc\": $rc, \"seconds\": $(( $(date +%s) - t ))}" > "$R/step_$name.json"
  [ $rc = 0 ] || say "   $name failed (rc $rc), see llamacpp.log"; return $rc; }

[ -f "$SRC/convert_hf_to_gguf.py" ] || { say "error: no llama.cpp source at $SRC (LLAMA_SRC); see 'prepare'"; exit 2; }
if [ $MODE = gpu ]; then CUDA="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"; NGL=99; else CUDA="-DGGML_NATIVE=${NATIVE:-OFF}"; NGL=0; fi
TH=(); [ -n "${THREADS:-}" ] && TH=(-t "$THREADS")
[ -n "${POLL:-}" ] && TH+=(--poll "$POLL")

# 1. build (or the tools of `build`)
if [ -n "${BIN:-}" ]; then
  [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-mtmd-cli" ] || { say "error: no llama-bench / llama-mtmd-cli in BIN=$BIN"; exit 2; }
  export LD_LIBRARY_PATH=$BIN${CUDA_LIBS:+:$CUDA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  say "prebuilt tools in $BIN"
else
timed configure cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release $CUDA -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF
timed build cmake --build "$BUILD" -j "$JOBS" --target llama-bench llama-mtmd-cli
BIN=$BUILD/bin
fi

# 2. convert (the same checkpoint as gpu_bench.sh)
[ -f "$CKPT/config.json" ] || timed checkpoint $PY -m quantize.realsize "$CKPT"
for t in f16 q8_0; do
  [ -f "$GG/text-$t.gguf" ] || timed convert_text_$t $PY scripts/llamacpp_convert.py "$SRC" "$CKPT" "$GG/text-$t.gguf" --outtype $t
done
[ -f "$GG/mmproj-f16.gguf" ] || timed convert_mmproj $PY scripts/llamacpp_convert.py "$SRC" "$CKPT" "$GG/mmproj-f16.gguf" \
  --outtype f16 --mmproj

# 3. bench: decode at edgeocr's prompt depth, a 1,093-token prompt, and image encoding through mtmd
N=${N_TOKENS:-$([ $MODE = gpu ] && echo 256,1024 || echo 256)}; DEPTH=${DEPTH:-1093}     # edgeocr's prompt for one page: 1,093 tokens
timed_to bench_decode "$R/decode.json" "$BIN/llama-bench" -m "$GG/text-f16.gguf" -m "$GG/text-q8_0.gguf" -n $N \
  -d $DEPTH -p 0 -ngl $NGL -fa 1 "${TH[@]}" -o json
timed_to bench_prompt "$R/prompt.json" "$BIN/llama-bench" -m "$GG/text-f16.gguf" -m "$GG/text-q8_0.gguf" -p $DEPTH \
  -n 0 -ngl $NGL -fa 1 "${TH[@]}" -o json
# the random-weight checkpoint has no chat template: llama.cpp's built-in HunyuanVL one
for k in $(seq 1 "${MTMD_RUNS:-3}"); do
  timed mtmd_$k "$BIN/llama-mtmd-cli" -m "$GG/text-f16.gguf" --mmproj "$GG/mmproj-f16.gguf" --image "$IMG" \
    -p "Extract the text in the image." -n 1 -ngl $NGL --temp 0 -c 4096 --chat-template hunyuan-vl -lv 4 "${TH[@]}"
done

# 4. one JSON
$PY - "$R" "$LOG" "$OUT/llamacpp.json" "$GG" "$IMG" <<'EOF'
import json, re, sys
from pathlib import Path
R, log, out, gg = Path(sys.argv[1]), Path(sys.argv[2]).read_text(errors="replace"), sys.argv[3], Path(sys.argv[4])
images = sys.argv[5].split(",")
def bench(name):
    try:
        rows = json.loads((R / f"{name}.json").read_text())
    except Exception as e:
        return {"error": str(e)}
    return [{"model": Path(r["model_filename"]).name, "type": r.get("model_type"), "n_prompt": r["n_prompt"],
             "n_gen": r["n_gen"], "n_depth": r.get("n_depth"), "avg_ms_per_token": r["avg_ns"] / 1e6 / max(r["n_gen"] or r["n_prompt"], 1),
             "avg_total_ms": r["avg_ns"] / 1e6, "stddev_ms": r["stddev_ns"] / 1e6, "tokens_per_s": r["avg_ts"],
             "build": r.get("build_commit"), "gpu": r.get("gpu_info"), "backends": r.get("backends")} for r in rows]
enc = [int(x) for x in re.findall(r"(?:slice encoded|batch encoding done) in (\d+) ms", log)]
dec = [int(x) for x in re.findall(r"decoded \(batch \d+/\d+\) in (\d+) ms", log)]
img_tokens = [int(x) for x in re.findall(r"n_tokens_batch = (\d+)", log)]
res = {"decode_at_depth": bench("decode"), "prompt": bench("prompt"),
       "mtmd_images_per_run": len(images), "mtmd_images": [Path(i).name for i in images],
       "mtmd_image_encode_ms": enc, "mtmd_image_prefill_ms": dec, "mtmd_image_tokens": img_tokens,
       "gguf_mib": {p.name: round(p.stat().st_size / 2**20, 1) for p in gg.glob("*.gguf")},
       "steps": {p.stem[5:]: json.loads(p.read_text()) for p in R.glob("step_*.json")}}
Path(out).write_text(json.dumps(res, indent=1))
print(json.dumps({k: res[k] for k in ("decode_at_depth", "prompt", "mtmd_image_encode_ms", "mtmd_image_prefill_ms")}, indent=1))
EOF
say "done in $(( $(date +%s) - T0 )) s: $OUT/llamacpp.json"
