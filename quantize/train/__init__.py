"""The demo model's trainer: a small HunyuanVL-architecture OCR model trained on synthetic business documents.

    python -m quantize train OUT [--init demo_model] [--gpu-seconds S | --steps N] [--budget-s B] [--resume]
                                 [--pool-pages N] [--pages DIR ...] [--batch 32] [--compile] [--device cuda]

Modules, one concern each:
- config.py    the recipe (a frozen dataclass, saved as OUT/train_config.json)
- pages.py     one page from the generator, a reading page or a labelled folder; its targets
- pool.py      every page rendered once on all host cores, letterboxed, targets tokenized, kept on the device
- batch.py     a step's batch drawn from the pool (seeded by the step) and assembled on the device
- augment.py   batched on-device augmentation and the runtime's normalization
- forward.py   the batched forward over transformers' HunYuanVLForConditionalGeneration modules
- glyph.py     the encoder's auxiliary per-cell character loss
- model.py     a fresh model + tokenizer, or a checkpoint to continue
- loop.py      schedule, optimizer, resume, logging
- measure.py   page views/s, GPU busy %, OUT/run_summary.json
- evaluate.py  CER on calibration_data/eval
"""

from __future__ import annotations


def main(argv=None) -> int:
    from quantize.train.__main__ import main as _main
    return _main(argv)


def eval_pages(*args, **kwargs):
    from quantize.train.evaluate import eval_pages as _eval_pages
    return _eval_pages(*args, **kwargs)
