"""Official HunyuanOCR task prompts (spec §7.1, §7.2) and the prompt layout (spec §5.4).

Prompts are fixed strings: Tencent notes that hand-edited wording silently degrades quality.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeocr.errors import PromptError

# 1.5 official prompts (Chinese), keyed as in Tencent's inference/utils/tasks.py.
TASKS_ZH: dict[str, str] = {
    "doc_parse": "提取文档图片中正文的所有信息用markdown格式表示，其中页眉、页脚部分忽略，表格用html格式表达，文档中公式用latex格式表示，按照阅读顺序组织进行解析。",
    "structured_parse": "提取图中的文字。",
    "spotting_json": "检测并识别图中所有的文字行，请按从上到下、从左到右的阅读顺序进行识别。 输出格式为 JSON 数组，每个元素必须包含：\"box\": [xmin, ymin, xmax, ymax]（坐标需归一化到 [0, 1000] 范围内）；\"text\": \"识别出的文字内容\"。 注意：请直接输出 JSON 数组，不要包含任何多余的描述性文字。",
    "spotting": "检测并识别图片中的文字，将文本坐标格式化输出。",
    "layout": "按照阅读顺序解析图中的版式信息。",
    "layout_parse": "提取文档图片中所有内容用markdown格式表示，表格用html格式表达，文档中公式用latex格式表示，请按照阅读顺序组织进行全文解析，并输出版式分析信息。",
    "chart_parse": "解析图中的图表，对于流程图使用Mermaid格式表示，其他图表使用Markdown格式表示。",
    "formula": "识别图片中的公式，用LaTeX格式表示。",
    "table": "把图中的表格解析为HTML。",
    "doc_trans_en2zh": "先解析文档，再将文档内容翻译为中文，其中页眉、页脚忽略，公式用latex格式表示，表格用html格式表示。",
    "trans_other2en": "按照阅读顺序，提取图中文字，公式用latex格式表示，表格用markdown格式表示，再将文字内容翻译为英文。",
    "trans_other2zh": "按照阅读顺序，提取图中文字，公式用latex格式表示，表格用markdown格式表示，再将文字内容翻译为中文。",
    "subtitles": "提取图片中的字幕。",
    "translate_en": "先提取文字，再将文字内容翻译为英文。若是文档，则其中页眉、页脚忽略。公式用latex格式表示，表格用html格式表示。",
}

# English counterparts from the 1.0 README table (spec §7.2).
TASKS_EN: dict[str, str] = {
    "spotting": "Detect and recognize text in the image, and output the text coordinates in a formatted manner.",
    "formula": "Identify the formula in the image and represent it using LaTeX format.",
    "table": "Parse the table in the image into HTML.",
    "chart_parse": "Parse the chart in the image; use Mermaid format for flowcharts and Markdown for other charts.",
    "doc_parse": "Extract all information from the main body of the document image and represent it in markdown format, ignoring headers and footers. Tables should be expressed in HTML format, formulas in the document should be represented using LaTeX format, and the parsing should be organized according to the reading order.",
    "structured_parse": "Extract the text in the image.",
    "subtitles": "Extract the subtitles from the image.",
    "translate_en": "First extract the text, then translate the text content into English. If it is a document, ignore the header and footer. Formulas should be represented in LaTeX format, and tables should be represented in HTML format.",
}

# Tasks whose output is parsed into lines with boxes.
SPOTTING_TASKS = frozenset({"spotting", "spotting_json"})
DEFAULT_TASK = "structured_parse"


def task_names() -> list[str]:
    return sorted(TASKS_ZH)


def task_prompt(task: str, lang: str = "zh") -> str:
    """The official instruction for `task` in `lang` ('zh' or 'en')."""
    table = {"zh": TASKS_ZH, "en": TASKS_EN}.get(lang)
    if table is None:
        raise PromptError(f"unknown prompt language {lang!r}; use 'zh' or 'en'")
    if task not in table:
        if task in TASKS_ZH:
            raise PromptError(f"task {task!r} has no English prompt; use lang 'zh' (English tasks: "
                              f"{', '.join(sorted(TASKS_EN))})")
        known = ", ".join(sorted(table))
        raise PromptError(f"unknown task {task!r} for language {lang!r}; known tasks: {known}")
    return table[task]


def field_extraction_prompt(keys: list[str], lang: str = "en") -> str:
    """IE prompt asking for several fields as JSON (spec §7.2)."""
    if not keys or any(not isinstance(k, str) or not k for k in keys):
        raise PromptError("field extraction needs a non-empty list of non-empty key names")
    listed = "[" + ",".join(f"'{k}'" for k in keys) + "]"
    if lang == "zh":
        return f"提取图片中的: {listed} 的字段内容，并按照 JSON 格式返回。"
    return f"Extract the content of the fields: {listed} from the image and return it in JSON format."


@dataclass(frozen=True)
class PromptTokens:
    """Token ids the prompt layout needs; all come from the checkpoint (manifest)."""

    bos: int              # <｜hy_begin▁of▁sentence｜>
    system_sep: int       # <｜hy_place▁holder▁no▁3｜>, ends the (empty) system message
    im_start: int         # image start
    im_end: int           # image end
    image: int            # image slot, repeated n_image_tokens times
    user: int             # <｜hy_User｜>, ends the user turn


def build_prompt_ids(tokens: PromptTokens, n_image_tokens: int, instruction_ids: list[int]) -> list[int]:
    """BOS, empty system + sep, start, image slots, end, instruction, <｜hy_User｜> (spec §5.4)."""
    return ([tokens.bos, tokens.system_sep, tokens.im_start]
            + [tokens.image] * n_image_tokens
            + [tokens.im_end] + list(instruction_ids) + [tokens.user])
