"""The transformers implementation as one side of `edgeocr check` (needs the [export] extra).

Same letterboxed canvas, same prompt ids, same decoding contract (greedy, repetition penalty,
the checkpoint's stop ids) as the runtime, so differences are engine numerics."""

from __future__ import annotations

import time
from pathlib import Path

from edgeocr import postprocess, preprocess, prompts
from edgeocr.model import OCRResult
from edgeocr.tokenizer import Tokenizer


class TransformersRunner:
    def __init__(self, checkpoint: str, device: str = "cpu", attn: str | None = None, dtype: str | None = None):
        import torch
        from transformers import HunYuanVLForConditionalGeneration

        from quantize.checkpoint import read_spec

        self.torch = torch
        self.spec = read_spec(Path(checkpoint))
        self.dev = "cuda" if device == "cuda" else "cpu"
        dtype = getattr(torch, dtype) if dtype else (torch.bfloat16 if self.dev == "cuda" else torch.float32)
        attn = attn or ("eager" if self.dev == "cpu" else "sdpa")
        self.model = HunYuanVLForConditionalGeneration.from_pretrained(
            checkpoint, attn_implementation=attn, dtype=dtype).to(self.dev).eval()
        self.dtype = dtype
        self.tok = Tokenizer(Path(checkpoint) / "tokenizer.json")
        t = self.spec.tokens
        self.ptoks = prompts.PromptTokens(bos=t.bos, system_sep=t.system_sep, im_start=t.im_start, im_end=t.im_end,
                                          image=t.image, user=t.user)

    def inputs(self, image, task=None, prompt=None, lang="zh"):
        """generate() inputs for the runtime's letterboxed canvas and prompt ids; also the letterbox."""
        torch = self.torch
        canvas, lb = preprocess.letterbox(preprocess.load_image(image))
        pixels = preprocess.normalize(canvas)
        g = canvas.shape[0] // 16
        n_img = (g // 2) * (g // 2 + 1) + 2
        instruction = prompt if prompt is not None else prompts.task_prompt(task or prompts.DEFAULT_TASK, lang)
        ids = prompts.build_prompt_ids(self.ptoks, n_img, self.tok.encode(instruction))
        ii = torch.tensor([ids], device=self.dev)
        return {"input_ids": ii, "attention_mask": torch.ones_like(ii),
                "pixel_values": torch.from_numpy(preprocess.patchify(pixels).copy()).to(self.dev, self.dtype),
                "image_grid_thw": torch.tensor([[1, g, g]], device=self.dev),
                "mm_token_type_ids": (ii == self.spec.tokens.image).int()}, lb

    def recognize(self, image, task=None, prompt=None, lang="zh", options=None) -> OCRResult:
        t0 = time.perf_counter()
        inputs, lb = self.inputs(image, task, prompt, lang)
        ids = inputs["input_ids"][0]
        t1 = time.perf_counter()
        with self.torch.no_grad():
            out = self.model.generate(**inputs, max_new_tokens=options.max_new_tokens, do_sample=False,
                                      repetition_penalty=options.repetition_penalty or self.spec.repetition_penalty,
                                      eos_token_id=list(self.spec.tokens.stop_ids), pad_token_id=self.spec.tokens.stop_ids[0])
        gen = out[0, len(ids):].tolist()
        t2 = time.perf_counter()
        text = self.tok.decode(gen)
        stop = bool(gen) and gen[-1] in self.spec.tokens.stop_ids
        lines = postprocess.parse_spotting(text, lb, preprocess.CANVAS) if task in prompts.SPOTTING_TASKS else []
        return OCRResult(text=text, lines=lines, finish_reason="stop" if stop else "length", prompt_tokens=len(ids),
                         generated_tokens=len(gen), token_ids=gen, task=task, image_size=(lb.width, lb.height),
                         timings_ms={"preprocess": (t1 - t0) * 1e3, "generate": (t2 - t1) * 1e3,
                                     "total": (t2 - t0) * 1e3})
