"""Convert a HunyuanVL checkpoint to GGUF with llama.cpp's own converter (text decoder, or the vision
projector with --mmproj), for scripts/llamacpp_bench.sh.

    python scripts/llamacpp_convert.py LLAMA_SRC CHECKPOINT OUT.gguf --outtype f16|q8_0 [--mmproj]

Two things the real HunyuanOCR checkpoint has and the random-weight ones made here (quantize.realsize,
quantize.tiny) lack are supplied, without touching llama.cpp's files:
- the converter hashes how the tokenizer splits a test string to name llama.cpp's pre-tokenizer, and stops on
  an unknown hash: the small byte-level BPE here is declared "default" (llama-bench feeds token ids, so the
  timings do not depend on it);
- the vision projector reads min/max pixels from preprocessor_config.json: HunyuanOCR 1.5's values
  (512^2 .. 4096^2, spec section 5) are written into a copy of the checkpoint's small files when absent.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

PREPROCESSOR = {"min_pixels": 262144, "max_pixels": 16777216, "patch_size": 16, "merge_size": 2,
                "temporal_patch_size": 1, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_std": [0.26862954, 0.26130258, 0.27577711]}


def with_preprocessor_config(ckpt: Path, work: Path) -> Path:
    """The checkpoint itself if it has preprocessor_config.json, else a directory of links to its files plus one."""
    if (ckpt / "preprocessor_config.json").exists():
        return ckpt
    d = work / ckpt.name
    d.mkdir(parents=True, exist_ok=True)
    for f in ckpt.iterdir():
        if not (d / f.name).exists():
            os.symlink(f.resolve(), d / f.name)
    (d / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=1))
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("llama_src", type=Path, help="llama.cpp source tree (convert_hf_to_gguf.py, conversion/, gguf-py/)")
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--outtype", default="f16", choices=["f16", "q8_0", "f32", "bf16"])
    ap.add_argument("--mmproj", action="store_true", help="convert the vision encoder + projector instead")
    a = ap.parse_args()
    src = a.llama_src.resolve()
    if not (src / "convert_hf_to_gguf.py").exists():
        print(f"error: {src} has no convert_hf_to_gguf.py", file=sys.stderr)
        return 2
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    sys.argv = ["convert_hf_to_gguf.py"]                  # the converter parses its own argv at import in places
    import conversion.base as base
    import convert_hf_to_gguf as conv

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = with_preprocessor_config(a.checkpoint.resolve(), Path(tmp))
        argv = ["convert_hf_to_gguf.py", str(ckpt), "--outfile", str(a.out), "--outtype", a.outtype]
        if a.mmproj:
            argv.append("--mmproj")
        sys.argv = argv
        t = time.perf_counter()
        conv.main()
        print(f"converted {a.checkpoint} -> {a.out} ({a.out.stat().st_size / 2**20:.0f} MiB, "
              f"{time.perf_counter() - t:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
