"""HTML/CSS business documents with randomized structure, typography and content.

Each kind is a function (Content, Style) -> Doc: an HTML body whose every piece of text sits in an
element with class "t" (one label item; it may wrap over several visual lines), the page width, and
the key/value fields shown on it.  Structure is drawn per page: grid, flex or table arrangements, column
counts and order, alignment, margins, borders, stripes, header bands, CSS multi-column text.
"""

from __future__ import annotations

import html as _html
from dataclasses import dataclass, field
from decimal import Decimal

from quantize.htmldocs.content import LANGS, Content, reading_charset
from quantize.htmldocs.render import MONO_FAMILIES, font_families

MIN_PAGE_W, MAX_PAGE_W = 760, 1240           # CSS px (= image px)
RECEIPT_W = (360, 600)
A4_RATIO = 1.414


@dataclass(frozen=True)
class Style:
    body_font: str           # CSS font-family list
    head_font: str
    mono_font: str
    size: int                # base font size, px
    line_height: float
    ink: str                 # text colour
    muted: str               # secondary text colour
    accent: str              # header bands, titles
    accent_text: str         # text on the accent band
    paper: str               # page background (CSS background value)
    rule: str                # border colour
    border: str              # table border style: "solid", "dashed", "dotted", "double", "none"
    margin: int              # page padding, px
    align: str               # title alignment
    stripe: str | None       # zebra stripe colour of table rows


@dataclass
class Doc:
    kind: str
    lang: str
    width: int
    body: str
    css: str = ""
    fields: dict = field(default_factory=dict)
    min_height: int = 0


def esc(s: str) -> str:
    return _html.escape(s, quote=True)


def t(text: str, cls: str = "", style: str = "", tag: str = "div") -> str:
    """One label item."""
    st = f' style="{style}"' if style else ""
    return f'<{tag} class="t {cls}"{st}>{esc(text)}</{tag}>'


def _hsl(c: Content, h: float, s: tuple[int, int], lum: tuple[int, int]) -> str:
    return f"hsl({h:.0f}, {c.n(*s)}%, {c.n(*lum)}%)"


def _stack(first: str, cjk: str) -> str:
    return f"'{first}', '{cjk}', sans-serif" if first != cjk else f"'{first}', sans-serif"


def make_style(c: Content) -> Style:
    fam = font_families()
    cjk = c.pick(fam.cjk)
    cjk_text = [f for f in fam.cjk if f not in MONO_FAMILIES] or list(fam.cjk)
    latin_text = [f for f in fam.latin if f not in MONO_FAMILIES] or list(fam.latin)
    if c.lang == "zh" or (c.lang == "mixed" and c.chance(0.5)):
        body = c.pick(cjk_text)
        body_stack = _stack(body, body)
    else:
        body_stack = _stack(c.pick(latin_text), c.pick(cjk_text))
    head_stack = body_stack if c.chance(0.5) else _stack(c.pick(latin_text + cjk_text), c.pick(cjk_text))
    monos = [f for f in fam.latin + fam.cjk if f in MONO_FAMILIES]
    mono_stack = _stack(c.pick(monos), cjk) if monos and c.chance(0.5) else body_stack
    hue = float(c.rng.uniform(0, 360))
    dark_band = c.chance(0.5)
    paper = c.pick(("#ffffff", "#ffffff", "#ffffff", _hsl(c, c.rng.uniform(0, 360), (10, 40), (94, 99)),
                    f"linear-gradient({c.n(0, 180)}deg, {_hsl(c, hue, (5, 30), (95, 99))}, "
                    f"{_hsl(c, hue + 40, (5, 30), (92, 98))})"))
    return Style(
        body_font=body_stack, head_font=head_stack, mono_font=mono_stack,
        size=c.n(12, 19), line_height=round(float(c.rng.uniform(1.2, 1.75)), 2),
        ink=_hsl(c, c.rng.uniform(0, 360), (0, 40), (3, 22)), muted=_hsl(c, c.rng.uniform(0, 360), (0, 25), (25, 42)),
        accent=_hsl(c, hue, (35, 80), (22, 40)) if dark_band else _hsl(c, hue, (30, 70), (82, 92)),
        accent_text="#ffffff" if dark_band else _hsl(c, hue, (40, 80), (8, 20)),
        paper=paper, rule=_hsl(c, hue, (0, 40), (20, 60)),
        border=c.pick(("solid", "solid", "dashed", "dotted", "double", "none")),
        margin=c.n(18, 80), align=c.pick(("left", "center", "right", "center")),
        stripe=_hsl(c, hue, (10, 50), (90, 96)) if c.chance(0.4) else None)


def base_css(s: Style, width: int) -> str:
    return (f"html, body {{ margin: 0; padding: 0; }} "
            f".page {{ box-sizing: border-box; width: {width}px; padding: {s.margin}px; background: {s.paper}; "
            f"color: {s.ink}; font-family: {s.body_font}; font-size: {s.size}px; line-height: {s.line_height}; "
            f"overflow-wrap: anywhere; }} "
            f".h {{ font-family: {s.head_font}; font-weight: 700; }} "
            f".m {{ font-family: {s.mono_font}; }} .mut {{ color: {s.muted}; }} "
            f".band {{ background: {s.accent}; color: {s.accent_text}; }} "
            f"table {{ border-collapse: collapse; }} "
            f"td, th {{ padding: {max(2, s.size // 4)}px {max(4, s.size // 2)}px; vertical-align: top; }} "
            f".grid td, .grid th {{ border: {2 if s.border == 'double' else 1}px {s.border} {s.rule}; }} "
            f".rule {{ border-bottom: 1px {s.border if s.border != 'none' else 'solid'} {s.rule}; }} "
            + (f".zebra tr:nth-child(even) td {{ background: {s.stripe}; }} " if s.stripe else ""))


def page_width(c: Content) -> int:
    return c.n(MIN_PAGE_W, MAX_PAGE_W)


def _title(c: Content, s: Style, text: str, scale: tuple[float, float] = (1.5, 2.4)) -> str:
    size = int(s.size * float(c.rng.uniform(*scale)))
    if c.chance(0.3):
        return t(text, "h band", f"font-size:{size}px;text-align:{s.align};padding:6px 12px;margin-bottom:12px")
    return t(text, "h", f"font-size:{size}px;text-align:{s.align};margin-bottom:{c.n(6, 20)}px;"
             f"letter-spacing:{c.pick((0, 0, 1, 2, 4))}px")


def _kv(c: Content, pairs: list[tuple[str, str]], cols: int, sep: str | None = None) -> str:
    """Key/value pairs as a CSS grid, a flex wrap or a table; one item per pair ("Key: value") or two."""
    sep = sep if sep is not None else c.pick(("：", ": ", " ", "："))
    mode = c.pick(("grid", "flex", "table"))
    joined = c.chance(0.5)
    cells = []
    for k, v in pairs:
        if joined:
            cells.append([t(f"{k}{sep}{v}".strip())])
        else:
            cells.append([t(f"{k}{sep.strip()}", "mut"), t(v, "m" if c.chance(0.4) else "")])
    if mode == "table":
        rows, row = [], []
        for cell in cells:
            row.append("".join(f"<td>{x}</td>" for x in cell))
            if len(row) == cols:
                rows.append(f"<tr>{''.join(row)}</tr>")
                row = []
        if row:
            rows.append(f"<tr>{''.join(row)}</tr>")
        cls = "grid" if c.chance(0.4) else ""
        return f'<table class="{cls}" style="margin:8px 0;width:{c.pick(("100%", "auto"))}">{"".join(rows)}</table>'
    if mode == "grid":
        gap = c.n(2, 10)
        inner = "".join(f'<div style="display:flex;gap:{c.n(4, 12)}px">{"".join(x)}</div>' for x in cells)
        return f'<div style="display:grid;grid-template-columns:repeat({cols},1fr);gap:{gap}px {c.n(8, 40)}px;margin:8px 0">{inner}</div>'
    inner = "".join(f'<div style="display:flex;gap:6px;min-width:{c.n(120, 260)}px">{"".join(x)}</div>' for x in cells)
    return f'<div style="display:flex;flex-wrap:wrap;gap:{c.n(2, 8)}px {c.n(16, 48)}px;margin:8px 0">{inner}</div>'


def _party_block(c: Content, caption: str, zh: bool | None = None) -> tuple[str, str]:
    name = c.company(zh) if c.chance(0.7) else c.name(zh)
    lines = [t(caption, "mut h", f"font-size:{int(c.rng.uniform(0.8, 1.0) * 100)}%"), t(name, "h" if c.chance(0.5) else "")]
    lines += [t(a) for a in c.address(zh)]
    if c.chance(0.7):
        lines.append(t(c.phone(), "m"))
    if c.chance(0.3):
        lines.append(t(c.email()))
    return "".join(lines), name


def _columns(c: Content, blocks: list[str]) -> str:
    if c.chance(0.5):
        return (f'<div style="display:flex;justify-content:space-between;gap:{c.n(16, 60)}px;margin:12px 0">'
                + "".join(f'<div style="flex:1">{b}</div>' for b in blocks) + "</div>")
    return (f'<div style="display:grid;grid-template-columns:repeat({len(blocks)},1fr);gap:{c.n(16, 60)}px;'
            f'margin:12px 0">' + "".join(f"<div>{b}</div>" for b in blocks) + "</div>")


def _table(c: Content, s: Style, header: list[str], rows: list[list[str]], num_cols: set[int],
           footer: list[list[str]] | None = None) -> str:
    head_cls = c.pick(("band", "", "h"))
    grid = s.border != "none" and c.chance(0.75)
    cls = " ".join(x for x in ("grid" if grid else "", "zebra") if x)
    num_align = c.pick(("right", "right", "center", "left"))
    th = "".join(f'<th class="{head_cls}" style="text-align:{num_align if i in num_cols else "left"}">{t(h, "h")}</th>'
                 for i, h in enumerate(header))
    body = []
    for r in rows:
        tds = "".join(f'<td style="text-align:{num_align if i in num_cols else "left"}">'
                      f'{t(v, "m" if i in num_cols and c.chance(0.5) else "")}</td>' for i, v in enumerate(r) if v != "")
        body.append(f"<tr>{tds}</tr>")
    foot = ""
    for r in footer or []:
        span = len(header) - len(r) + 1
        cells = [f'<td colspan="{span}" style="text-align:right">{t(r[0], "h")}</td>']
        cells += [f'<td style="text-align:{num_align}">{t(v, "h m")}</td>' for v in r[1:]]
        foot += f"<tr>{''.join(cells)}</tr>"
    rule = "" if grid else f"border-top:2px solid {s.rule};border-bottom:2px solid {s.rule};"
    return (f'<table class="{cls}" style="width:100%;margin:{c.n(8, 20)}px 0;{rule}"><thead><tr>{th}</tr></thead>'
            f"<tbody>{''.join(body)}{foot}</tbody></table>")


# ---------------------------------------------------------------------------- kinds
def invoice(c: Content, s: Style) -> Doc:
    w = page_width(c)
    cur_sym, cur_code = c.currency()
    seller_html, seller = _party_block(c, c.bi("销售方", "From"))
    buyer_html, buyer = _party_block(c, c.bi("购买方", "Bill to"))
    blocks = [seller_html, buyer_html]
    if c.chance(0.3):
        blocks.append(_party_block(c, c.bi("收货方", "Ship to"))[0])
    no, dt = c.doc_number(), c.date()
    title = c.pick(("增值税普通发票", "发票", "销售发票", "电子发票（普通发票）")) if c.lang == "zh" else \
        c.bi(c.pick(("发票", "商业发票")), c.pick(("INVOICE", "Invoice", "Tax Invoice", "Commercial Invoice")))
    meta = [(c.bi("发票号码", "Invoice No."), no), (c.bi("开票日期", "Date"), dt)]
    if c.chance(0.6):
        meta.append((c.bi("付款期限", "Due date"), c.date()))
    if c.chance(0.5):
        meta.append((c.bi("订单号", "PO No."), c.code("PO-999999")))
    n_items = c.n(2, 12)
    rows, subtotal = [], Decimal("0.00")
    header = [c.bi("序号", "#"), c.bi("货物或服务名称", "Description"), c.bi("数量", "Qty"), c.bi("单位", "Unit"),
              c.bi("单价", "Unit price"), c.bi("金额", "Amount")]
    keep = [0, 1, 2, 3, 4, 5] if c.chance(0.5) else [1, 2, 4, 5]
    for i in range(n_items):
        q = c.n(1, 200)
        price = c.money(0.5, 5000)
        amt = (price * q).quantize(Decimal("0.01"))
        subtotal += amt
        full = [str(i + 1), c.product(), str(q), c.unit(), c.fmt_money(price), c.fmt_money(amt)]
        rows.append([full[k] for k in keep])
    rate = c.pick((Decimal("0.13"), Decimal("0.06"), Decimal("0.09"), Decimal("0.20"), Decimal("0.0")))
    tax = (subtotal * rate).quantize(Decimal("0.01"))
    total = subtotal + tax
    footer = [[c.bi("小计", "Subtotal"), c.fmt_money(subtotal)],
              [c.bi(f"税额 {int(rate * 100)}%", f"Tax {int(rate * 100)}%"), c.fmt_money(tax)],
              [c.bi("价税合计", "Total") + f" ({cur_code})", f"{cur_sym}{c.fmt_money(total)}"]]
    table = _table(c, s, [header[k] for k in keep], rows, {i for i, k in enumerate(keep) if k in (0, 2, 4, 5)}, footer)
    notes = ""
    if c.chance(0.7):
        notes = t(c.bi("备注", "Notes"), "h", "margin-top:12px") + t(c.paragraph((1, 3)), "", f"max-width:{c.n(50, 100)}%")
    bank = ""
    if c.chance(0.6):
        bank = _kv(c, [(c.bi("开户行", "Bank"), c.company() if c.chance(0.3) else c.bi("工商银行" + c.city_zh()[:2] + "支行",
                                                                                         "First " + c.name(False).split()[-1] + " Bank")),
                       (c.bi("账号", "Account"), c.account())], cols=1)
    head = _title(c, s, title)
    order = [head, _kv(c, meta, cols=c.n(1, 3)), _columns(c, blocks)]
    if c.chance(0.4):
        order[1], order[2] = order[2], order[1]
    body = "".join(order) + table + notes + bank
    return Doc("invoice", c.lang, w, body, fields={"invoice_no": no, "date": dt, "seller": seller, "buyer": buyer,
                                                  "total": f"{cur_sym}{c.fmt_money(total)}"})


def receipt(c: Content, s: Style) -> Doc:
    w = c.n(*RECEIPT_W)
    shop = c.company() if c.chance(0.5) else (c.chars("鑫盛华联好又多家乐便利超市", 2) + c.pick(("超市", "便利店", "餐厅", "药房"))
                                               if c.zh() else c.pick(("Market", "Cafe", "Pharmacy", "Deli", "Store"))
                                               + " " + c.name(False).split()[-1])
    dash = f"border-top:1px {c.pick(('dashed', 'dotted', 'solid'))} {s.ink};margin:6px 0"
    parts = [t(shop, "h", f"text-align:center;font-size:{int(s.size * 1.4)}px")]
    parts += [t(a, "", "text-align:center") for a in c.address()]
    parts.append(t(f"{c.bi('电话', 'Tel')} {c.phone()}", "", "text-align:center"))
    dt, tm = c.date(), c.time()
    no = c.code(c.pick(("99999999", "A999-999999", "9999 9999 9999")))
    parts.append(f'<div style="{dash}"></div>')
    parts.append(_kv(c, [(c.bi("单号", "Receipt"), no), (c.bi("日期", "Date"), f"{dt} {tm}"),
                         (c.bi("收银员", "Cashier"), c.code("999") if c.chance(0.5) else c.name())], cols=1))
    parts.append(f'<div style="{dash}"></div>')
    total = Decimal("0.00")
    for _ in range(c.n(2, 14)):
        q = c.n(1, 6)
        price = c.money(0.8, 300)
        amt = price * q
        total += amt
        name = c.product() if c.chance(0.6) else (c.pick(("牛奶", "面包", "咖啡", "苹果", "酸奶", "鸡蛋")) if c.zh() else c.pick(("Milk", "Bread", "Coffee", "Eggs", "Juice"))) + " " + c.code("99")
        if c.chance(0.5):
            parts.append(f'<div style="display:flex;justify-content:space-between;gap:8px">{t(name)}'
                         f'{t(c.fmt_money(amt), "m", "white-space:nowrap")}</div>')
            parts.append(t(f"{q} x {c.fmt_money(price)}", "mut", "padding-left:16px"))
        else:
            parts.append(f'<div style="display:grid;grid-template-columns:3fr 1fr 1fr;gap:6px">{t(name)}'
                         f'{t(f"x{q}", "", "text-align:right")}{t(c.fmt_money(amt), "m", "text-align:right")}</div>')
    parts.append(f'<div style="{dash}"></div>')
    tot = c.fmt_money(total)
    parts.append(f'<div style="display:flex;justify-content:space-between;font-size:{int(s.size * 1.25)}px">'
                 f'{t(c.bi("合计", "TOTAL"), "h")}{t(tot, "h m")}</div>')
    paid = c.pick(("现金", "微信支付", "支付宝", "银联卡")) if c.zh() else c.pick(("Cash", "VISA **** " + c.code("9999"), "Mastercard", "Apple Pay"))
    parts.append(_kv(c, [(c.bi("支付方式", "Paid by"), paid)], cols=1))
    if c.chance(0.7):
        parts.append(t(c.pick(("谢谢惠顾，欢迎再次光临", "请保留小票作为退换凭证", "Thank you for shopping with us!",
                               "Please keep your receipt")) + " " + c.code("99"), "", "text-align:center;margin-top:10px"))
    css = f".page {{ font-family: {s.mono_font if c.chance(0.5) else s.body_font}; }}"
    return Doc("receipt", c.lang, w, "".join(parts), css=css, fields={"receipt_no": no, "date": f"{dt} {tm}", "total": tot})


COLUMN_POOL = ("date", "code", "name", "qty", "amount", "status", "region", "percent", "person", "phone")


def _cell(c: Content, kind: str) -> str:
    if kind == "date":
        return c.date()
    if kind == "code":
        return c.code(c.pick(("AA-9999", "999999", "A99-9999", "AAA999")))
    if kind == "name":
        return c.product()
    if kind == "qty":
        return str(c.n(0, 99999))
    if kind == "amount":
        return c.fmt_money(c.money(1, 999999), c.n(0, 1))
    if kind == "status":
        return c.pick(("已完成", "处理中", "待审核", "已取消", "已发货")) if c.zh() else c.pick(("Done", "Pending", "Open", "Shipped", "Void"))
    if kind == "region":
        return c.city_zh() if c.zh() else c.address(False)[1].split(",")[0]
    if kind == "percent":
        return f"{c.rng.uniform(-50, 150):.{c.n(0, 2)}f}%"
    if kind == "person":
        return c.name()
    return c.phone()


CAPTIONS = {"date": ("日期", "Date"), "code": ("编号", "Code"), "name": ("名称", "Item"), "qty": ("数量", "Qty"),
            "amount": ("金额", "Amount"), "status": ("状态", "Status"), "region": ("地区", "Region"),
            "percent": ("增长率", "Change"), "person": ("负责人", "Owner"), "phone": ("电话", "Phone")}


def table(c: Content, s: Style) -> Doc:
    w = page_width(c)
    ncol = c.n(3, 7)
    cols = [COLUMN_POOL[int(i)] for i in c.rng.permutation(len(COLUMN_POOL))[:ncol]]
    title = c.bi(c.pick(("销售明细表", "库存统计表", "月度报表", "项目进度表", "费用汇总表")) + c.code(" 99"),
                 c.pick(("Sales Report", "Inventory Summary", "Monthly Report", "Project Tracker", "Expense Summary"))
                 + " " + c.code("Q9") + " " + str(c.n(2018, 2027)))
    rows = [[_cell(c, k) for k in cols] for _ in range(c.n(5, 28))]
    header = [c.bi(*CAPTIONS[k]) for k in cols]
    parts = [_title(c, s, title, (1.3, 2.0))]
    if c.chance(0.6):
        parts.append(_kv(c, [(c.bi("编制单位", "Prepared by"), c.company()), (c.bi("日期", "Date"), c.date())], cols=2))
    parts.append(_table(c, s, header, rows, {i for i, k in enumerate(cols) if k in ("qty", "amount", "percent")}))
    if c.chance(0.5):
        parts.append(t(c.paragraph((1, 2)), "mut", f"font-size:{max(11, s.size - 2)}px"))
    return Doc("table", c.lang, w, "".join(parts), fields={"title": title, "rows": str(len(rows))})


def form(c: Content, s: Style) -> Doc:
    w = page_width(c)
    title = c.bi(c.pick(("入职登记表", "客户信息登记表", "报销申请单", "会员申请表", "设备借用申请表")),
                 c.pick(("Application Form", "Registration Form", "Expense Claim", "Membership Application", "Change Request")))
    name, zh_name = c.name(), c.zh()
    pairs = [(c.bi("姓名", "Name"), name), (c.bi("日期", "Date"), c.date()), (c.bi("电话", "Phone"), c.phone()),
             (c.bi("邮箱", "Email"), c.email()), (c.bi("单位", "Company"), c.company()),
             (c.bi("地址", "Address"), " ".join(c.address()) if not zh_name else "".join(c.address())),
             (c.bi("编号", "Ref"), c.doc_number()), (c.bi("部门", "Department"), c.pick(("财务部", "销售部", "技术部", "Finance", "Sales", "R&D")))]
    order = [pairs[int(i)] for i in c.rng.permutation(len(pairs))[:c.n(4, len(pairs))]]
    parts = [_title(c, s, title)]
    if c.chance(0.5):
        parts.append(t(c.paragraph((1, 2)), "mut", "margin-bottom:10px"))
    if c.chance(0.5):
        rows = "".join(f'<tr><td class="band" style="width:{c.n(18, 35)}%">{t(k, "h")}</td><td>{t(v)}</td></tr>' for k, v in order)
        parts.append(f'<table class="grid" style="width:100%">{rows}</table>')
    else:
        parts.append(_kv(c, order, cols=c.n(1, 3)))
    opts = [c.bi(*p) for p in (("同意", "Agree"), ("不同意", "Disagree"), ("需补充材料", "More documents needed"), ("加急", "Urgent"))]
    box = f"display:inline-block;width:{s.size}px;height:{s.size}px;border:1px solid {s.ink};margin-right:6px;vertical-align:middle"
    parts.append('<div style="display:flex;flex-wrap:wrap;gap:24px;margin:14px 0">' + "".join(
        f'<div><span class="deco" style="{box}"></span>{t(o, tag="span")}</div>' for o in opts[:c.n(2, 4)]) + "</div>")
    parts.append(t(c.bi("申请理由", "Reason"), "h") + t(c.paragraph((2, 4)), "", "margin-bottom:16px"))
    sign = f'<div class="rule" style="width:{c.n(120, 220)}px;height:{s.size * 2}px"></div>'
    parts.append('<div style="display:flex;justify-content:space-between;margin-top:24px">'
                 f'<div>{t(c.bi("申请人签字", "Signature"))}{sign}</div><div>{t(c.bi("日期", "Date") + "： " + c.date())}</div></div>')
    return Doc("form", c.lang, w, "".join(parts), fields={"name": name})


def letter(c: Content, s: Style) -> Doc:
    w = page_width(c)
    co = c.company()
    head_parts = [t(co, "h", f"font-size:{int(s.size * c.rng.uniform(1.3, 2.0))}px")]
    head_parts += [t(a, "mut") for a in c.address()]
    head_parts.append(t(f"{c.bi('电话', 'Tel')} {c.phone()}  {c.email()}", "mut"))
    head = (f'<div style="text-align:{s.align};border-bottom:2px solid {s.accent};padding-bottom:8px;margin-bottom:18px">'
            + "".join(head_parts) + "</div>")
    dt, to = c.date(), c.name()
    parts = [head, t(dt, "", f"text-align:{c.pick(('left', 'right'))};margin-bottom:12px")]
    parts += [t(to)] + [t(a) for a in c.address()]
    subj = c.bi("关于", "Re: ") + c.sentence(words=(3, 7))
    parts.append(t(subj, "h", "margin:14px 0"))
    parts.append(t(c.bi("尊敬的", "Dear ") + to + c.bi("：", ","), "", "margin-bottom:10px"))
    just = c.pick(("left", "justify"))
    indent = "2em" if c.lang == "zh" and c.chance(0.7) else "0"
    ncols = 2 if c.chance(0.2) else 1
    paras = "".join(t(c.paragraph((2, 6)), "", f"text-align:{just};text-indent:{indent};margin-bottom:{c.n(6, 16)}px", tag="p")
                    for _ in range(c.n(2, 5)))
    parts.append(f'<div style="column-count:{ncols};column-gap:{c.n(24, 48)}px">{paras}</div>')
    parts.append(t(c.bi("此致 敬礼", "Sincerely,"), "", "margin-top:16px"))
    sender = c.name()
    parts.append(t(sender, "h", f"margin-top:{c.n(20, 50)}px"))
    parts.append(t(c.bi(c.pick(("总经理", "财务经理", "项目负责人")), c.pick(("General Manager", "Finance Manager", "Project Lead"))), "mut"))
    return Doc("letter", c.lang, w, "".join(parts), css="p { margin: 0; }", fields={"date": dt, "recipient": to, "sender": sender})


def shipping_note(c: Content, s: Style) -> Doc:
    w = page_width(c)
    title = c.bi(c.pick(("送货单", "发货单", "装箱单", "物流运单")), c.pick(("Delivery Note", "Packing List", "Waybill", "Dispatch Note")))
    waybill = c.code(c.pick(("SF9999999999999", "1Z999A99999999999", "YT9999999999999", "JD99999999999", "AA999999999AA")))
    shipper, sname = _party_block(c, c.bi("发货人", "Shipper"))
    consignee, cname = _party_block(c, c.bi("收货人", "Consignee"))
    meta = [(c.bi("运单号", "Waybill No."), waybill), (c.bi("发货日期", "Ship date"), c.date()),
            (c.bi("承运商", "Carrier"), c.company() if c.chance(0.5) else c.pick(("顺丰速运", "中通快递", "DHL Express", "FedEx Freight")))]
    header = [c.bi("箱号", "Carton"), c.bi("品名", "Description"), c.bi("件数", "Pcs"), c.bi("毛重(kg)", "Gross kg"),
              c.bi("尺寸(cm)", "Dims cm")]
    rows, total_w, total_p = [], 0.0, 0
    for i in range(c.n(2, 14)):
        p, wt = c.n(1, 500), round(float(c.rng.uniform(0.2, 80)), 1)
        total_w += wt
        total_p += p
        rows.append([f"{i + 1:0{c.n(1, 3)}d}", c.product(), str(p), f"{wt:.1f}", f"{c.n(10, 120)}x{c.n(10, 80)}x{c.n(5, 60)}"])
    tw = f"{total_w:.1f}"
    parts = [_title(c, s, title), _kv(c, meta, cols=c.n(1, 3)), _columns(c, [shipper, consignee]),
             _table(c, s, header, rows, {0, 2, 3}, [[c.bi("合计", "Total"), str(total_p), tw, ""]])]
    parts.append('<div style="display:flex;justify-content:space-between;margin-top:28px;gap:20px">' + "".join(
        f'<div style="flex:1">{t(x)}<div class="rule" style="height:{s.size * 2}px"></div></div>'
        for x in (c.bi("发货人签字", "Shipped by"), c.bi("收货人签字", "Received by"), c.bi("日期", "Date"))[:c.n(2, 3)]) + "</div>")
    return Doc("shipping_note", c.lang, w, "".join(parts), fields={"waybill": waybill, "shipper": sname,
                                                                   "consignee": cname, "gross_weight": tw})


def bank_statement(c: Content, s: Style) -> Doc:
    w = page_width(c)
    bank = (c.chars("华信恒通中兴民安广发建设招商浦发", 2) + c.pick(("银行", "商业银行", "农村商业银行"))) if c.zh() else \
        c.pick(("First", "National", "Pacific", "Union", "Metro", "Citizens")) + " " + c.company(False).split()[0] + " Bank"
    holder, acct = c.name(), c.account()
    n_rows = c.n(6, 26)
    y, m = c.n(2015, 2027), c.n(1, 12)                              # a one-month statement
    sep = c.pick(("-", "/", "."))
    days = [f"{y}{sep}{m:02d}{sep}{d:02d}" for d in [1] + sorted(c.n(1, 28) for _ in range(n_rows)) + [28]]
    start, end = days[0], days[-1]
    opening = c.money(10, 200000)
    bal = opening
    rows = []
    for day in days[1:-1]:
        amt = c.money(1, 20000)
        debit = c.chance(0.55) and amt <= bal                        # no overdraft
        bal = bal - amt if debit else bal + amt
        desc = c.pick((c.bi("转账", "Transfer") + " " + c.name(), c.bi("消费", "POS") + " " + c.company(),
                       c.bi("工资", "Salary") + " " + c.code("999999"), c.bi("利息", "Interest"),
                       c.bi("手续费", "Fee") + " " + c.code("AA99"), c.bi("ATM取款", "ATM withdrawal") + " " + c.code("9999")))
        rows.append([day, desc, c.fmt_money(amt) if debit else "", "" if debit else c.fmt_money(amt),
                     c.fmt_money(bal)])
    rows = [[v if v else "-" for v in r] for r in rows]
    header = [c.bi("交易日期", "Date"), c.bi("摘要", "Description"), c.bi("支出", "Debit"), c.bi("存入", "Credit"),
              c.bi("余额", "Balance")]
    parts = [f'<div style="display:flex;justify-content:space-between;align-items:flex-end">'
             f'{t(bank, "h", f"font-size:{int(s.size * 1.8)}px;color:{s.rule}")}'
             f'{t(c.bi("账户对账单", "Account Statement"), "h")}</div>',
             _kv(c, [(c.bi("户名", "Account holder"), holder), (c.bi("账号", "Account No."), acct),
                     (c.bi("期间", "Period"), f"{start} - {end}"), (c.bi("币种", "Currency"), c.currency()[1])], cols=2)]
    summary = [(c.bi("期初余额", "Opening balance"), c.fmt_money(opening)), (c.bi("期末余额", "Closing balance"), c.fmt_money(bal))]
    parts.append('<div style="display:flex;gap:16px;margin:10px 0">' + "".join(
        f'<div class="band" style="padding:8px 14px;flex:1">{t(k)}{t(v, "h m", f"font-size:{int(s.size * 1.3)}px")}</div>'
        for k, v in summary) + "</div>")
    parts.append(_table(c, s, header, rows, {2, 3, 4}))
    parts.append(t(f"{c.bi('第', 'Page ')}{c.n(1, 5)}{c.bi('页', '')} / {c.n(5, 9)}", "mut", "text-align:right"))
    return Doc("bank_statement", c.lang, w, "".join(parts), fields={"account_holder": holder, "account_no": acct,
                                                                    "closing_balance": c.fmt_money(bal)})


def notice(c: Content, s: Style) -> Doc:
    """A newsletter / notice: CSS multi-column body, side box, headings."""
    w = page_width(c)
    title = c.bi(c.pick(("关于", "通知：", "公告：")) + c.sentence(True, (2, 5)).rstrip("。；！"),
                 "Notice: " + c.sentence(False, (3, 6)).rstrip(".;!"))
    parts = [_title(c, s, title), t(f"{c.company()}  {c.date()}", "mut", f"text-align:{s.align};margin-bottom:12px")]
    ncols = c.n(1, 3)
    body = ""
    for _ in range(c.n(2, 5)):
        if c.chance(0.5):
            body += t(c.sentence(words=(2, 5)), "h", "margin-top:8px")
        body += t(c.paragraph((2, 5)), "", f"margin-bottom:8px;text-align:{c.pick(('left', 'justify'))}", tag="p")
    parts.append(f'<div style="column-count:{ncols};column-gap:{c.n(20, 50)}px;column-rule:1px {s.border} {s.rule}">{body}</div>')
    if c.chance(0.6):
        items = "".join(t(f"{i + 1}. {c.sentence(words=(3, 9))}", tag="li") for i in range(c.n(2, 5)))
        parts.append(f'<ul style="list-style:none;padding:10px 16px;border:1px solid {s.rule};margin-top:12px">{items}</ul>')
    return Doc("notice", c.lang, w, "".join(parts), css="p { margin: 0; }", fields={"title": title})


def reading(c: Content, s: Style) -> Doc:
    """Random tokens at random offsets, sizes, fonts and colours: nothing to recall, only to read.
    Rows of one to three runs (flex, wrapping), sometimes a wrapped block of random words."""
    fam = font_families()
    w = page_width(c)
    pool = reading_charset()
    base = c.n(12, 36)
    rows = []
    for _ in range(c.n(6, 30)):
        runs = []
        for _ in range(c.n(1, 3)):
            size = max(10, int(base * float(c.rng.uniform(0.6, 1.7))))
            family = c.pick(fam.cjk + fam.latin)
            ink = _hsl(c, c.rng.uniform(0, 360), (0, 70), (0, 35))
            wrap = c.chance(0.12)
            words = " ".join(c.random_token(pool) for _ in range(c.n(8, 30) if wrap else c.n(1, 7)))
            shape = f"width:{c.n(180, max(190, w // 2))}px;" if wrap else "white-space:nowrap;"
            runs.append(t(words, "", f"{shape}font-size:{size}px;font-family:'{family}','{c.pick(fam.cjk)}';"
                          f"color:{ink};line-height:{float(c.rng.uniform(1.15, 1.6)):.2f};"
                          f"font-weight:{c.pick((400, 400, 700))};letter-spacing:{c.pick((0, 0, 1, 3))}px"))
        rows.append(f'<div style="display:flex;flex-wrap:wrap;align-items:{c.pick(("baseline", "flex-start", "center"))};'
                    f'gap:{c.n(4, 30)}px {c.n(16, 160)}px;margin:{c.n(2, 40)}px 0 0 {c.n(0, w // 4)}px;'
                    f'justify-content:{c.pick(("flex-start", "flex-start", "center", "space-between", "flex-end"))}">'
                    + "".join(runs) + "</div>")
    return Doc("reading", c.lang, w, "".join(rows), fields={})


KINDS = {"invoice": invoice, "receipt": receipt, "table": table, "form": form, "letter": letter,
         "shipping_note": shipping_note, "bank_statement": bank_statement, "notice": notice, "reading": reading}


def build(kind: str, rng) -> Doc:
    """One document of `kind`, all choices from `rng`."""
    lang = LANGS[int(rng.integers(len(LANGS)))]
    c = Content(rng, lang)
    s = make_style(c)
    doc = KINDS[kind](c, s)
    doc.css = base_css(s, doc.width) + doc.css
    return doc


def html_page(doc: Doc) -> str:
    mh = f"min-height:{doc.min_height}px;" if doc.min_height else ""
    return (f'<!doctype html><html><head><meta charset="utf-8"><style>{doc.css}</style></head>'
            f'<body><div class="page" style="{mh}">{doc.body}</div></body></html>')
