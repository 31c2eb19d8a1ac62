"""The transformers implementation as the reference side of `python -m quantize compare` / `bench-hf`
(quantize.compare) and the parity tests (toolchain: needs the [export] extra, torch and transformers).

Driven with exactly the runtime's inputs: the same letterboxed canvas, prompt ids and decoding contract
(greedy, repetition penalty, the checkpoint's stop ids, read by quantize.checkpoint like the exporter does),
so differences are engine numerics.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from edgeocr import postprocess, preprocess, prompts
from edgeocr.artifact import image_token_count
from edgeocr.decode import FinishReason
from edgeocr.result import OCRResult, drop_cut_character
from edgeocr.tokenizer import Tokenizer


def load(checkpoint, device: str = "cpu", attn: str | None = None, dtype=None):
    """HunYuanVLForConditionalGeneration in eval mode (CPU: FP32 eager; CUDA: bf16 sdpa by default)."""
    import torch
    from transformers import HunYuanVLForConditionalGeneration

    dtype = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    attn = attn or ("eager" if device == "cpu" else "sdpa")
    return HunYuanVLForConditionalGeneration.from_pretrained(
        str(checkpoint), attn_implementation=attn, dtype=dtype).to(device).eval()


def inputs(model, pixels: np.ndarray, ids) -> dict:
    """forward()/generate() inputs.  pixels: [B, 3, S, S] normalized canvases (one per row of ids);
    ids: [B, L] or [L] prompt (+ generated) ids (the caller masks left padding)."""
    import torch

    dev, dt = model.device, model.dtype
    ids = np.atleast_2d(np.asarray(ids, np.int64))
    patch = model.config.vision_config.patch_size
    g = pixels.shape[-1] // patch
    pv = np.concatenate([preprocess.patchify(p[None], patch) for p in pixels])
    ii = torch.from_numpy(ids).to(dev)
    return {"input_ids": ii, "attention_mask": torch.ones_like(ii),
            "pixel_values": torch.from_numpy(np.ascontiguousarray(pv)).to(dev, dt),
            "image_grid_thw": torch.tensor([[1, g, g]] * len(pixels), device=dev),
            "mm_token_type_ids": (ii == model.config.image_token_id).int()}


def image_embeds(model, pixels: np.ndarray) -> np.ndarray:
    import torch
    with torch.no_grad():
        x = inputs(model, pixels, np.zeros(1, np.int64))
        return model.model.get_image_features(x["pixel_values"], x["image_grid_thw"]).pooler_output[0].float().cpu().numpy()


def logits(model, pixels: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Teacher-forced logits [L, V] over the whole sequence in one forward."""
    import torch
    with torch.no_grad():
        return model(**inputs(model, pixels, ids)).logits[0].float().cpu().numpy()


def generate(model, pixels, ids, max_new_tokens: int, stop, penalty: float) -> list[int]:
    import torch
    with torch.no_grad():
        out = model.generate(**inputs(model, pixels, ids), max_new_tokens=max_new_tokens, do_sample=False,
                             repetition_penalty=penalty, eos_token_id=list(stop), pad_token_id=stop[0])
    return out[0, len(ids):].tolist()


class TransformersRunner:
    """recognize() like OCRModel's, on transformers."""

    def __init__(self, checkpoint: str, device: str = "cpu", attn: str | None = None, dtype: str | None = None):
        import torch

        self.torch = torch
        self.dev = "cuda" if device == "cuda" else "cpu"
        self.model = load(checkpoint, self.dev, attn, getattr(torch, dtype) if dtype else None)
        self.dtype = self.model.dtype
        from quantize.checkpoint import read_spec

        self.spec = spec = read_spec(Path(checkpoint))
        self.tok = Tokenizer(Path(checkpoint) / "tokenizer.json")
        t = spec.tokens
        self.ptoks = prompts.PromptTokens(bos=t.bos, system_sep=t.system_sep, im_start=t.im_start, im_end=t.im_end,
                                          image=t.image, user=t.user)
        self.stop_ids = list(t.stop_ids)
        self.penalty = spec.repetition_penalty

    def page(self, image, task=None, prompt=None, lang="zh"):
        """The runtime's letterboxed, normalized canvas [1, 3, S, S], prompt ids [L] and letterbox."""
        canvas, lb = preprocess.letterbox(preprocess.load_image(image))
        pixels = preprocess.normalize(canvas)
        v = self.model.config.vision_config
        n_img = image_token_count(canvas.shape[0], v.patch_size, v.spatial_merge_size)
        instruction = prompt if prompt is not None else prompts.task_prompt(task or prompts.DEFAULT_TASK, lang)
        return pixels, prompts.build_prompt_ids(self.ptoks, n_img, self.tok.encode(instruction)), lb

    def inputs(self, image, task=None, prompt=None, lang="zh"):
        """generate() inputs for the runtime's letterboxed canvas and prompt ids; also the letterbox."""
        pixels, ids, lb = self.page(image, task, prompt, lang)
        return inputs(self.model, pixels, ids), lb

    def recognize(self, image, task=None, prompt=None, lang="zh", options=None) -> OCRResult:
        return self.recognize_many([image], task, prompt, lang, options)[0]

    def recognize_many(self, images, task=None, prompt=None, lang="zh", options=None) -> list[OCRResult]:
        """recognize() of several pages in one batched generate: one canvas size and one instruction give every
        page the same prompt length, so no row is padded; each row ends at its first stop id, as it would alone
        (on a GPU a batch's GEMMs may round differently from one page's, which can change a close argmax)."""
        t0 = time.perf_counter()
        pages = [self.page(im, task, prompt, lang) for im in images]
        if len({len(p[1]) for p in pages}) != 1:
            return [self.recognize(im, task, prompt, lang, options) for im in images]
        x = inputs(self.model, np.concatenate([p[0] for p in pages]), np.stack([p[1] for p in pages]))
        n_prompt = x["input_ids"].shape[1]
        t1 = time.perf_counter()
        with self.torch.no_grad():
            out = self.model.generate(**x, max_new_tokens=options.max_new_tokens, do_sample=False,
                                      repetition_penalty=options.repetition_penalty or self.penalty,
                                      eos_token_id=self.stop_ids, pad_token_id=self.stop_ids[0])
        t2 = time.perf_counter()
        timings = {"preprocess": (t1 - t0) * 1e3, "generate": (t2 - t1) * 1e3, "total": (t2 - t0) * 1e3}
        results = []
        for row, (_, _, lb) in zip(out[:, n_prompt:].tolist(), pages):
            gen = row[:next((i + 1 for i, t in enumerate(row) if t in self.stop_ids), len(row))]
            stop = bool(gen) and gen[-1] in self.stop_ids
            text = drop_cut_character(self.tok.decode(gen), gen, self.tok, FinishReason.STOP if stop else
                                      FinishReason.LENGTH)       # as the runtime's result (edgeocr.result)
            lines = postprocess.parse_spotting(text, lb, preprocess.CANVAS) if task in prompts.SPOTTING_TASKS else []
            results.append(OCRResult(text=text, lines=lines, finish_reason=FinishReason.STOP if stop else
                                     FinishReason.LENGTH, prompt_tokens=n_prompt, generated_tokens=len(gen),
                                     token_ids=gen, task=task, image_size=(lb.width, lb.height), timings_ms=timings))
        return results
