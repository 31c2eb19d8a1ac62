"""Document kinds.  Each builder draws one page in reading order and fills its key/value fields."""

from __future__ import annotations

from decimal import Decimal

from quantize.docgen import content as C
from quantize.docgen.core import INK, Page
from quantize.docgen.fonts import FontSet


def _cjk(p: Page, bold=False, style=None):
    return p.fonts.pick(p.rng, cjk=True, style=style, bold=bold)


def _lat(p: Page, bold=False, style=None):
    return p.fonts.pick(p.rng, cjk=False, style=style, bold=bold)


def _page(fonts: FontSet, rng, w: int, h: int, tint: bool = True) -> Page:
    bg = (255, 255, 255)
    if tint and rng.random() < 0.4:
        bg = tuple(int(v) for v in rng.integers(236, 256, 3))
    return Page(int(w), int(h), fonts, rng, bg=bg)


def vat_invoice_cn(fonts, rng) -> tuple[Page, str, str]:
    w = int(rng.integers(1050, 1280))
    p = _page(fonts, rng, w, int(w * 0.66))
    red = (150, 40, 30) if rng.random() < 0.7 else INK
    m = int(rng.integers(30, 60))
    kind = C.pick(rng, ["增值税专用发票", "增值税普通发票", "电子发票（普通发票）"])
    city = C.pick(rng, C.CITIES_ZH)[:-1]
    title_font, f, fb = _cjk(p, True, "serif"), _cjk(p), _cjk(p, True)
    p.text((w // 2, m), f"{city}{kind}", title_font, int(w * 0.03), fill=red, anchor="ma")
    code, no, day = f"{rng.integers(10**11, 10**12)}", f"{rng.integers(10**7, 10**8)}", C.date(rng, "zh")
    fs = int(w * 0.0145)
    y = m + int(w * 0.05)
    p.text((w - m - int(w * 0.28), y), f"发票代码：{code}", f, fs)
    p.text((w - m - int(w * 0.28), y + fs * 1.7), f"发票号码：{no}", f, fs)
    p.text((w - m - int(w * 0.28), y + fs * 3.4), f"开票日期：{day}", f, fs)
    y += int(fs * 5.5)
    buyer, seller = C.company_zh(rng), C.company_zh(rng)
    b_id, s_id = C.fake_uscc(rng), C.fake_uscc(rng)
    top = y
    p.rect((m, top, w - m, p.height - m - fs * 3), outline=red, width=2)
    y += fs // 2
    for label, val in (("购买方名称", buyer), ("纳税人识别号", b_id), ("地址、电话", f"{C.address_zh(rng)} {C.landline_cn(rng)}")):
        p.text((m + 10, y), f"{label}：{val}", f, p.fit(f"{label}：{val}", f, fs, w - 2 * m - 20))
        y += int(fs * 1.6)
    p.hline(m, w - m, y, fill=red, width=2)
    y += fs // 2
    cols = ["货物或应税劳务名称", "规格型号", "单位", "数量", "单价", "金额", "税率", "税额"]
    xs = [m + 10] + [m + int((w - 2 * m) * r) for r in (0.27, 0.42, 0.5, 0.58, 0.68, 0.8, 0.87)]
    for x, c in zip(xs, cols):
        p.text((x, y), c, f, int(fs * 0.95), fill=red)
    y += int(fs * 1.7)
    rate = C.pick(rng, [Decimal("0.13"), Decimal("0.06"), Decimal("0.09")])
    total, tax_total = Decimal(0), Decimal(0)
    for _ in range(int(rng.integers(1, 5))):
        name, spec, unit = C.pick(rng, C.GOODS_ZH)
        qty = int(rng.integers(1, 50))
        price = C.money(rng, 5, 3000)
        amt = (price * qty).quantize(Decimal("0.01"))
        tax = (amt * rate).quantize(Decimal("0.01"))
        total, tax_total = total + amt, tax_total + tax
        for x, v in zip(xs, [f"*{name}*", spec, unit, str(qty), C.fmt_money(price, False), C.fmt_money(amt, False),
                             f"{int(rate * 100)}%", C.fmt_money(tax, False)]):
            if v:
                p.text((x, y), v, f, int(fs * 0.95))
        y += int(fs * 1.6)
    y = max(y, top + int(fs * 16))
    p.text((xs[0], y), "合计", fb, fs)
    p.text((xs[5], y), f"¥{C.fmt_money(total, False)}", f, fs)
    p.text((xs[7], y), f"¥{C.fmt_money(tax_total, False)}", f, fs)
    y += int(fs * 1.8)
    p.hline(m, w - m, y - fs // 3, fill=red, width=2)
    grand = total + tax_total
    upper = C.rmb_uppercase(grand)
    p.text((m + 10, y), f"价税合计（大写）{upper}", f, fs)
    p.text((xs[5], y), f"（小写）¥{C.fmt_money(grand, False)}", f, fs)
    y += int(fs * 1.8)
    p.hline(m, w - m, y - fs // 3, fill=red, width=2)
    p.text((m + 10, y), f"销售方名称：{seller}", f, p.fit(f"销售方名称：{seller}", f, fs, w - 2 * m - 20))
    y += int(fs * 1.6)
    p.text((m + 10, y), f"纳税人识别号：{s_id}", f, fs)
    yb = p.height - m - int(fs * 2.2)
    payee, checker, drawer = C.name_zh(rng), C.name_zh(rng), C.name_zh(rng)
    for i, (lab, v) in enumerate((("收款人", payee), ("复核", checker), ("开票人", drawer))):
        p.text((m + 10 + i * (w - 2 * m) // 3, yb), f"{lab}：{v}", f, fs)
    p.fields = {"发票代码": code, "发票号码": no, "开票日期": day, "购买方名称": buyer, "购买方纳税人识别号": b_id,
                "销售方名称": seller, "销售方纳税人识别号": s_id, "合计金额": C.fmt_money(total, False),
                "合计税额": C.fmt_money(tax_total, False), "价税合计大写": upper, "价税合计小写": C.fmt_money(grand, False)}
    return p, "vat_invoice_cn", "zh"


def invoice_en(fonts, rng) -> tuple[Page, str, str]:
    w = int(rng.integers(820, 900))
    p = _page(fonts, rng, w, int(w * 1.414))
    m = int(rng.integers(50, 90))
    f, fb = _lat(p), _lat(p, True)
    fs = int(w * 0.017)
    seller = C.company_en(rng)
    a1, a2 = C.address_en(rng)
    y = m
    inv, day, due = f"INV-{rng.integers(2019, 2027)}-{rng.integers(1, 99999):05d}", C.date(rng, "us"), C.date(rng, "us")
    if rng.random() < 0.5:        # layout A: seller top-left, INVOICE top-right, meta under it
        p.text((m, y), seller, fb, int(fs * 1.6))
        p.text((w - m, y), "INVOICE", fb, int(fs * 2.4), anchor="ra", fill=(30, 60, 120))
        y += int(fs * 2.6)
        for s in (a1, a2, C.phone_us(rng)):
            p.text((m, y), s, f, fs)
            y += int(fs * 1.5)
        yy = m + int(fs * 2.6)
        for lab, v in (("Invoice No.", inv), ("Date", day), ("Due Date", due)):
            p.text((w - m - int(w * 0.35), yy), f"{lab}: {v}", f, fs)
            yy += int(fs * 1.5)
    else:                         # layout B: banner, seller block right-aligned, meta in one row
        p.rect((0, 0, w, int(fs * 4)), outline=None, fill=(40, 70, 120))
        p.text((m, int(fs * 1.0)), "INVOICE", fb, int(fs * 2.2), fill=(255, 255, 255))
        y = int(fs * 5)
        for s, font in ((seller, fb), (a1, f), (a2, f), (C.phone_us(rng), f)):
            p.text((w - m, y), s, font, fs, anchor="ra")
            y += int(fs * 1.5)
        y += fs
        x = m
        for lab, v in (("Invoice No.", inv), ("Date", day), ("Due Date", due)):
            p.text((x, y), f"{lab}: {v}", f, int(fs * 0.9))
            x += int((w - 2 * m) / 3)
        yy = y + int(fs * 1.5)
    y = max(y, yy) + fs * 2
    buyer = C.company_en(rng)
    b1, b2 = C.address_en(rng)
    p.text((m, y), "Bill To:", fb, fs)
    y += int(fs * 1.5)
    for s in (buyer, b1, b2):
        p.text((m, y), s, f, fs)
        y += int(fs * 1.5)
    y += fs
    xs = [m, int(w * 0.55), int(w * 0.68), w - m]
    p.rect((m - 6, y - 6, w - m + 6, y + int(fs * 1.6)), outline=None, fill=(225, 230, 240))
    for x, c, anc in zip(xs, ["Description", "Qty", "Unit Price", "Amount"], ["la", "la", "la", "ra"]):
        p.text((x, y), c, fb, fs, anchor=anc)
    y += int(fs * 2.2)
    sub = Decimal(0)
    for _ in range(int(rng.integers(2, 9))):
        desc, qty, price = C.pick(rng, C.GOODS_EN), int(rng.integers(1, 20)), C.money(rng, 3, 900)
        amt = price * qty
        sub += amt
        for x, v, anc in zip(xs, [desc, str(qty), f"${C.fmt_money(price)}", f"${C.fmt_money(amt)}"], ["la", "la", "la", "ra"]):
            p.text((x, y), v, f, fs, anchor=anc)
        y += int(fs * 1.6)
        p.hline(m, w - m, y - fs // 4, fill=(200, 200, 200))
    rate = C.pick(rng, [Decimal("0.05"), Decimal("0.0725"), Decimal("0.08"), Decimal("0.1")])
    tax = (sub * rate).quantize(Decimal("0.01"))
    total = sub + tax
    y += fs
    for lab, v, font in (("Subtotal", sub, f), (f"Tax ({rate * 100:.2f}%)", tax, f), ("Total Due", total, fb)):
        p.text((xs[2], y), lab, font, fs)
        p.text((xs[3], y), f"${C.fmt_money(v)}", font, fs, anchor="ra")
        y += int(fs * 1.6)
    y += fs * 2
    p.text((m, y), "Payment terms: Net 30. Thank you for your business!", f, int(fs * 0.9))
    p.fields = {"invoice_number": inv, "invoice_date": day, "due_date": due, "seller": seller, "buyer": buyer,
                "subtotal": C.fmt_money(sub), "tax": C.fmt_money(tax), "total": C.fmt_money(total)}
    return p, "invoice_en", "en"


def receipt(fonts, rng) -> tuple[Page, str, str]:
    lang = C.pick(rng, ["zh", "en", "mixed"])
    n = int(rng.integers(3, 12))
    w = int(rng.integers(480, 620))
    p = _page(fonts, rng, w, 420 + n * 44 + int(rng.integers(0, 80)))
    m = int(rng.integers(20, 40))
    mono = p.fonts.pick(rng, cjk=lang != "en", style="mono")
    fs = int(w * 0.04)
    store = C.pick(rng, ["便利店", "超市", "生活馆"]) if lang == "zh" else C.pick(rng, ["Mart", "Grocery", "Market"])
    store = (C.pick(rng, C.CO_PREFIX_ZH) + store) if lang == "zh" else f"{C.pick(rng, C.CO_EN_A)} {store}"
    y = m
    hx, anc = (w // 2, "ma") if rng.random() < 0.6 else (m, "la")     # centered or left-aligned header
    p.text((hx, y), store, p.fonts.pick(rng, cjk=lang != "en", bold=True), int(fs * 1.3), anchor=anc)
    y += int(fs * 2)
    addr = C.address_zh(rng) if lang != "en" else ", ".join(C.address_en(rng))
    p.text((hx, y), addr, mono, p.fit(addr, mono, int(fs * 0.8), w - 2 * m), anchor=anc)
    y += int(fs * 1.4)
    tel = C.landline_cn(rng) if lang != "en" else C.phone_us(rng)
    p.text((hx, y), ("电话 " if lang != "en" else "Tel ") + tel, mono, int(fs * 0.8), anchor=anc)
    y += int(fs * 1.6)
    day = f"{C.date(rng)} {rng.integers(7, 23):02d}:{rng.integers(0, 60):02d}"
    p.text((m, y), day, mono, int(fs * 0.85))
    y += int(fs * 1.4)
    p.text((m, y), "-" * 40, mono, int(fs * 0.85), record=False)
    y += int(fs * 1.2)
    total = Decimal(0)
    for _ in range(n):
        zh, en = C.pick(rng, C.SHOP_ITEMS)
        name = {"zh": zh, "en": en, "mixed": f"{zh} {en}"}[lang]
        qty, price = int(rng.integers(1, 4)), C.money(rng, 1, 60)
        total += qty * price
        p.text((m, y), f"{name} x{qty}", mono, p.fit(f"{name} x{qty}", mono, int(fs * 0.85), int(w * 0.6)))
        p.text((w - m, y), C.fmt_money(qty * price, False), mono, int(fs * 0.85), anchor="ra")
        y += int(fs * 1.35)
    p.text((m, y), "-" * 40, mono, int(fs * 0.85), record=False)
    y += int(fs * 1.2)
    cash = Decimal(int(total) + int(rng.integers(1, 50)))
    labels = {"zh": ("合计", "现金", "找零"), "en": ("TOTAL", "CASH", "CHANGE"), "mixed": ("合计 TOTAL", "现金 CASH", "找零 CHANGE")}[lang]
    cur = "¥" if lang != "en" else "$"
    for lab, v in zip(labels, (total, cash, cash - total)):
        p.text((m, y), lab, mono, int(fs * 0.95))
        p.text((w - m, y), f"{cur}{C.fmt_money(v, False)}", mono, int(fs * 0.95), anchor="ra")
        y += int(fs * 1.4)
    y += fs
    thanks = {"zh": "谢谢惠顾，欢迎再次光临", "en": "Thank you for shopping!", "mixed": "谢谢惠顾 Thank you!"}[lang]
    p.text((w // 2, y), thanks, mono, p.fit(thanks, mono, int(fs * 0.85), w - 2 * m), anchor="ma")
    p.fields = {"store": store, "date": day, "total": C.fmt_money(total, False), "cash": C.fmt_money(cash, False),
                "change": C.fmt_money(cash - total, False)}
    return p, "receipt", lang


def id_card(fonts, rng) -> tuple[Page, str, str]:
    lang = C.pick(rng, ["zh", "en"])
    w = int(rng.integers(900, 1100))
    h = int(w * 0.63)
    p = Page(w, h, fonts, rng, bg=tuple(int(v) for v in rng.integers(215, 245, 3)))
    p.rect((6, 6, w - 6, h - 6), outline=(120, 140, 170), width=4)
    m = int(w * 0.06)
    f, fb = (_cjk(p), _cjk(p, True)) if lang == "zh" else (_lat(p), _lat(p, True))
    fs = int(w * 0.032)
    photo = (int(w * 0.66), int(h * 0.18), int(w * 0.92), int(h * 0.68))
    p.rect(photo, outline=(90, 90, 90), width=2, fill=(200, 205, 212))
    birth = f"{rng.integers(1960, 2005)}{rng.integers(1, 13):02d}{rng.integers(1, 29):02d}"
    y = int(h * 0.1)
    if lang == "zh":
        name, sex = C.name_zh(rng), C.pick(rng, ["男", "女"])
        idn = C.fake_cn_id(rng, birth)
        addr = C.address_zh(rng)
        rows = [("姓名", name), ("性别", sex), ("民族", "汉"), ("出生", f"{birth[:4]}年{int(birth[4:6])}月{int(birth[6:])}日")]
        for lab, v in rows:
            p.text((m, y), lab, f, int(fs * 0.8), fill=(60, 90, 140))
            p.text((m + int(fs * 3.2), y), v, fb, fs)
            y += int(fs * 1.75)
        p.text((m, y), "住址", f, int(fs * 0.8), fill=(60, 90, 140))
        p.text((m + int(fs * 3.2), y), addr, fb, p.fit(addr, fb, fs, photo[0] - m - int(fs * 3.4)))
        p.text((m, int(h * 0.82)), "公民身份号码", f, int(fs * 0.8), fill=(60, 90, 140))
        p.text((m + int(fs * 5.2), int(h * 0.81)), idn, fb, int(fs * 1.05))
        fields = {"姓名": name, "性别": sex, "出生": birth, "住址": addr, "公民身份号码": idn}
    else:
        name = C.name_en(rng)
        sex = C.pick(rng, ["M", "F"])
        doc = f"{chr(65 + int(rng.integers(26)))}{rng.integers(10**7, 10**8)}"
        exp = f"{rng.integers(27, 36)}{rng.integers(1, 13):02d}{rng.integers(1, 29):02d}"
        p.text((m, y), "IDENTITY CARD", fb, int(fs * 1.1), fill=(40, 70, 120))
        y += int(fs * 2)
        rows = [("Surname", name.split()[1].upper()), ("Given names", name.split()[0].upper()), ("Sex", sex),
                ("Date of birth", f"{birth[6:]}.{birth[4:6]}.{birth[:4]}"), ("Document No.", doc),
                ("Date of expiry", f"{exp[4:]}.{exp[2:4]}.20{exp[:2]}")]
        for lab, v in rows:
            p.text((m, y), lab, f, int(fs * 0.6), fill=(60, 90, 140))
            p.text((m, y + int(fs * 0.75)), v, fb, int(fs * 0.85))
            y += int(fs * 1.85)
        mrz1 = f"IDUTO{doc}{C.mrz_check(doc)}".ljust(30, "<")
        dob = birth[2:]
        mrz2 = f"{dob}{C.mrz_check(dob)}{sex}{exp}{C.mrz_check(exp)}UTO".ljust(29, "<")
        mrz2 += C.mrz_check(mrz1[5:30] + mrz2[0:7] + mrz2[8:15] + mrz2[18:29])
        mono = p.fonts.pick(rng, cjk=False, style="mono")
        p.text((m, int(h * 0.8)), mrz1, mono, p.fit(mrz1, mono, int(fs * 0.9), w - 2 * m))
        p.text((m, int(h * 0.89)), mrz2, mono, p.fit(mrz2, mono, int(fs * 0.9), w - 2 * m))
        fields = {"surname": rows[0][1], "given_names": rows[1][1], "sex": sex, "date_of_birth": rows[3][1],
                  "document_number": doc, "date_of_expiry": rows[5][1]}
    spec = "SPECIMEN 样本" if lang == "zh" else "SPECIMEN"
    p.text((photo[0] + 8, photo[3] + int(fs * 0.6)), spec, p.fonts.pick(rng, cjk=True, bold=True), int(fs * 0.9),
           fill=(200, 40, 40))
    p.fields = fields
    return p, "id_card", lang


def form(fonts, rng) -> tuple[Page, str, str]:
    lang = C.pick(rng, ["zh", "en"])
    w = int(rng.integers(850, 980))
    p = _page(fonts, rng, w, int(w * 1.3))
    m = int(rng.integers(50, 90))
    f, fb = (_cjk(p), _cjk(p, True)) if lang == "zh" else (_lat(p), _lat(p, True))
    hand = p.fonts.pick(rng, cjk=lang == "zh", style=C.pick(rng, ["serif", "sans", "mono"]))
    fs = int(w * 0.02)
    y = m
    title = C.pick(rng, ["入职登记表", "客户信息登记表", "报销申请单"]) if lang == "zh" else C.pick(
        rng, ["Employment Application Form", "Customer Registration Form", "Expense Claim Form"])
    p.text((w // 2, y), title, fb, int(fs * 1.6), anchor="ma")
    y += int(fs * 3.5)
    if lang == "zh":
        birth = C.date(rng, "zh")
        data = [("姓名", C.name_zh(rng)), ("联系电话", C.phone_cn(rng)), ("出生日期", birth),
                ("身份证号", C.fake_cn_id(rng, f"{rng.integers(1960, 2005)}0{rng.integers(1, 10)}1{rng.integers(0, 10)}")),
                ("工作单位", C.company_zh(rng)), ("通讯地址", C.address_zh(rng)), ("申请金额", f"¥{C.fmt_money(C.money(rng, 100, 50000))}"),
                ("开户银行", "中国工商银行" + C.pick(rng, C.CITIES_ZH)[:-1] + "分行"), ("银行账号", C.bank_account(rng))]
    else:
        a1, a2 = C.address_en(rng)
        data = [("Full Name", C.name_en(rng)), ("Phone", C.phone_us(rng)), ("Date of Birth", C.date(rng, "us")),
                ("Email", f"user{rng.integers(100, 9999)}@example.com"), ("Employer", C.company_en(rng)),
                ("Address", f"{a1}, {a2}"), ("Amount Requested", f"${C.fmt_money(C.money(rng, 100, 50000))}"),
                ("Account No.", C.bank_account(rng)), ("Reference", f"REF-{rng.integers(10**5, 10**6)}")]
    data = data[: int(rng.integers(6, len(data) + 1))]
    lab_w = int(w * 0.22)
    for lab, v in data:
        p.text((m, y), f"{lab}：" if lang == "zh" else f"{lab}:", f, fs)
        p.hline(m + lab_w, w - m, y + int(fs * 1.3), fill=(120, 120, 120))
        p.text((m + lab_w + 10, y - 2), v, hand, p.fit(v, hand, int(fs * 1.05), w - 2 * m - lab_w - 20), fill=(20, 40, 110))
        y += int(fs * 2.6)
    y += fs
    opts = ["是", "否"] if lang == "zh" else ["Yes", "No"]
    q = "是否已婚" if lang == "zh" else "Existing customer"
    choice = int(rng.integers(2))
    p.text((m, y), q, f, fs)
    x = m + lab_w
    for i, o in enumerate(opts):
        p.rect((x, y + 2, x + fs, y + fs + 2), outline=INK, width=2)
        if i == choice:
            p.draw.line([(x + 3, y + fs // 2), (x + fs // 2, y + fs - 1), (x + fs - 2, y + 4)], fill=(20, 40, 110), width=3)
        p.text((x + int(fs * 1.5), y), o, f, fs)
        x += int(fs * 6)
    y += int(fs * 3)
    sig = "申请人签字：" if lang == "zh" else "Signature:"
    p.text((m, y), sig, f, fs)
    p.text((w - m - int(w * 0.3), y), (("日期：" if lang == "zh" else "Date: ") + C.date(rng, "iso")), f, fs)
    p.fields = {lab: v for lab, v in data}
    p.fields[q] = opts[choice]
    return p, "form", lang


def menu(fonts, rng) -> tuple[Page, str, str]:
    lang = C.pick(rng, ["zh", "mixed", "en"])
    n = int(rng.integers(6, 14))
    w = int(rng.integers(800, 1000))
    p = _page(fonts, rng, w, 330 + n * int(w * 0.06))
    m = int(w * 0.08)
    title_f = p.fonts.pick(rng, cjk=lang != "en", style="serif", bold=True)
    f = p.fonts.pick(rng, cjk=lang != "en")
    fs = int(w * 0.026)
    name = C.pick(rng, C.CO_PREFIX_ZH) + C.pick(rng, ["小馆", "酒家", "面馆", "茶餐厅"])
    title = {"zh": name, "mixed": f"{name} MENU", "en": f"{C.pick(rng, C.CO_EN_A)} Kitchen"}[lang]
    y = m // 2
    p.text((w // 2, y), title, title_f, int(fs * 2), anchor="ma", fill=(120, 30, 20))
    y += int(fs * 3.5)
    sect = {"zh": "招牌菜", "mixed": "招牌菜 Signature Dishes", "en": "Signature Dishes"}[lang]
    p.text((m, y), sect, p.fonts.pick(rng, cjk=lang != "en", bold=True), int(fs * 1.2))
    y += int(fs * 2)
    prices = {}
    cur = "¥" if lang != "en" else "$"
    for zh, en in [C.pick(rng, C.DISHES_ZH) for _ in range(n)]:
        dish = {"zh": zh, "mixed": f"{zh} {en}", "en": en}[lang]
        if dish in prices:
            continue
        price = f"{cur}{rng.integers(8, 188)}"
        prices[dish] = price
        bw = p.text((m, y), dish, f, fs)[2]
        pw = p.text((w - m, y), price, f, fs, anchor="ra")[0]
        dots = "." * max(0, (pw - bw - 20) // max(1, p.text_width(".", f, fs)))
        p.text((bw + 10, y), dots, f, fs, fill=(150, 150, 150), record=False)
        y += int(fs * 2.1)
    p.fields = prices
    return p, "menu", lang


def shipping_label(fonts, rng) -> tuple[Page, str, str]:
    lang = C.pick(rng, ["en", "mixed"])
    w = int(rng.integers(700, 850))
    p = _page(fonts, rng, w, int(w * 1.5), tint=False)
    m = int(w * 0.05)
    f, fb = p.fonts.pick(rng, cjk=lang == "mixed"), p.fonts.pick(rng, cjk=lang == "mixed", bold=True)
    fs = int(w * 0.032)
    p.rect((m // 2, m // 2, w - m // 2, p.height - m // 2), outline=INK, width=3)
    y = m
    carrier = C.pick(rng, ["PRIORITY MAIL", "EXPRESS", "GROUND", "顺丰速运 SF EXPRESS", "中通快递 ZTO"])
    p.text((m, y), carrier, fb, int(fs * 1.5))
    y += int(fs * 2.6)
    p.hline(m // 2, w - m // 2, y, width=3)
    y += fs
    frm, f1, f2 = C.name_en(rng), *C.address_en(rng)
    p.text((m, y), "FROM:", fb, int(fs * 0.8))
    y += int(fs * 1.3)
    for s in (frm, f1, f2):
        p.text((m, y), s, f, int(fs * 0.85))
        y += int(fs * 1.25)
    y += fs
    to = C.name_zh(rng) if lang == "mixed" else C.name_en(rng)
    t1, t2 = (C.address_zh(rng), C.pick(rng, C.CITIES_ZH)) if lang == "mixed" else C.address_en(rng)
    phone = C.phone_cn(rng) if lang == "mixed" else C.phone_us(rng)
    p.text((m, y), "SHIP TO:" if lang == "en" else "收件人 SHIP TO:", fb, fs)
    y += int(fs * 1.6)
    for s in (to, t1, t2, phone):
        p.text((m + fs, y), s, fb, p.fit(s, fb, int(fs * 1.2), w - 2 * m - fs))
        y += int(fs * 1.7)
    y += fs
    p.hline(m // 2, w - m // 2, y, width=3)
    y += fs
    trk = f"{C.pick(rng, ['1Z', 'SF', 'ZT', '94'])}{rng.integers(10**11, 10**12)}"
    weight = f"{rng.uniform(0.2, 30):.1f} kg"
    xb = m
    bar_h = int(fs * 4)
    while xb < w - m:
        bw = int(rng.integers(1, 5))
        if rng.random() < 0.55:
            p.draw.rectangle((xb, y, xb + bw, y + bar_h), fill=INK)
        xb += bw + int(rng.integers(1, 4))
    y += bar_h + fs // 2
    p.text((w // 2, y), trk, p.fonts.pick(rng, cjk=False, style="mono"), fs, anchor="ma")
    y += int(fs * 2.2)
    p.text((m, y), f"TRACKING #: {trk}", f, int(fs * 0.85))
    y += int(fs * 1.5)
    p.text((m, y), f"WEIGHT: {weight}", f, int(fs * 0.85))
    y += int(fs * 1.5)
    p.text((m, y), f"DATE: {C.date(rng)}", f, int(fs * 0.85))
    p.fields = {"carrier": carrier, "ship_to": to, "tracking_number": trk, "weight": weight, "phone": phone}
    return p, "shipping_label", lang


def table(fonts, rng) -> tuple[Page, str, str]:
    lang = C.pick(rng, ["zh", "en"])
    rows, cols = int(rng.integers(4, 12)), int(rng.integers(3, 6))
    w = int(rng.integers(900, 1150))
    rh = int(w * 0.045)
    p = _page(fonts, rng, w, 200 + (rows + 1) * rh + int(rng.integers(0, 60)))
    m = int(rng.integers(40, 70))
    f, fb = (_cjk(p), _cjk(p, True)) if lang == "zh" else (_lat(p), _lat(p, True))
    fs = int(rh * 0.45)
    title = C.pick(rng, ["2026年第三季度销售统计表", "部门费用明细表", "库存盘点表"]) if lang == "zh" else C.pick(
        rng, ["Quarterly Sales Summary", "Department Expenses", "Inventory Count"])
    p.text((w // 2, m // 2), title, fb, int(fs * 1.4), anchor="ma")
    heads_zh = ["项目", "一月", "二月", "三月", "合计"]
    heads_en = ["Item", "Jan", "Feb", "Mar", "Total"]
    heads = (heads_zh if lang == "zh" else heads_en)[:cols - 1] + [(heads_zh if lang == "zh" else heads_en)[-1]]
    top = m // 2 + int(fs * 3)
    cw = (w - 2 * m) // cols
    if rng.random() < 0.5:        # ruled grid
        for r in range(rows + 2):
            p.hline(m, m + cw * cols, top + r * rh, width=2 if r in (0, 1) else 1)
        for c in range(cols + 1):
            p.vline(m + c * cw, top, top + (rows + 1) * rh)
    else:                         # banded rows, no vertical rules
        p.rect((m, top, m + cw * cols, top + rh), outline=None, fill=(210, 220, 235))
        for r in range(2, rows + 1, 2):
            p.rect((m, top + r * rh, m + cw * cols, top + (r + 1) * rh), outline=None, fill=(240, 242, 246))
    for c, hd in enumerate(heads):
        p.text((m + c * cw + cw // 2, top + rh // 2), hd, fb, fs, anchor="mm")
    fields = {}
    for r in range(rows):
        label = C.pick(rng, [g[0] for g in C.GOODS_ZH]) if lang == "zh" else C.pick(rng, C.GOODS_EN)
        vals = [C.money(rng, 0, 99999) for _ in range(cols - 2)]
        cells = [label] + [C.fmt_money(v) for v in vals] + [C.fmt_money(sum(vals, Decimal(0)))]
        yc = top + (r + 1) * rh + rh // 2
        for c, v in enumerate(cells):
            if c == 0:
                p.text((m + 8, yc), v, f, p.fit(v, f, fs, cw - 16), anchor="lm")
            else:
                p.text((m + (c + 1) * cw - 8, yc), v, f, p.fit(v, f, fs, cw - 16), anchor="rm")
        fields[f"{label}#{r + 1}"] = cells[-1]
    p.fields = fields
    return p, "table", lang


KINDS = {
    "vat_invoice_cn": vat_invoice_cn, "invoice_en": invoice_en, "receipt": receipt, "id_card": id_card,
    "form": form, "menu": menu, "shipping_label": shipping_label, "table": table,
}
