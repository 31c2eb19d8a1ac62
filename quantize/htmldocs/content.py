"""Randomized document content: names, companies, addresses, goods, amounts, dates, codes and running
text in Chinese, English or both.

Every value is assembled from parts (syllables, characters, word pools, digit patterns), so strings
rarely repeat across pages: the pools are large and combined, never a short list of finished values.
All values are fake.  `Content` draws from one numpy Generator, so the same seed gives the same text.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import numpy as np

# ---------------------------------------------------------------------------- pools (parts, not values)
SURNAMES = ("王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏吕丁任沈"
            "姚卢姜崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵万钱严覃武戴莫孔向汤"
            "常温康施文牛樊葛邢安齐易乔伍庞颜倪庄聂章鲁岳翟殷詹申欧耿关兰焦俞左柳甘祝包宁尚符舒阮柯纪梅童凌毕单季"
            "裴霍涂成苗谷盛曲翁冉骆蓝路游辛靳管柴蒙鲍华喻祁蒲房滕屈饶解牟艾尤阳时穆农司卓古吉缪简车项连芦麦褚娄窦")
GIVEN_CHARS = ("伟芳娜秀英敏静丽强磊军洋勇艳杰娟涛明超兰霞平刚桂华玉萍红娥玲芬燕彬鹏辉建国志晓东海波宇航子涵欣怡浩然"
               "梓萱雨桐一鸣思远佳琪俊凯瑞博文轩泽宁嘉铭诗琳梦瑶晨阳逸飞鑫磊雪婷慧颖婉清嘉豪天佑若曦景行承恩沐安书"
               "诚德福荣春秋冬梅竹松柏林森岚峰川江河湖昊睿哲言润之昕悦然楠柔心怡乐康健永长兴盛茂新立坤元亮光耀宏")
PLACE_CHARS = ("江河湖海山川东南西北中华安平泰康宁远长新兴广德昌盛富阳青云龙凤金玉宝丰裕永和顺通达临清明光武文嘉"
               "兴化城州台滨岭峰泉溪源桥沙石林松柏桂梅兰荷锦绣春秋")
PROVINCES = ("河北", "山西", "辽宁", "吉林", "黑龙江", "江苏", "浙江", "安徽", "福建", "江西", "山东", "河南",
             "湖北", "湖南", "广东", "海南", "四川", "贵州", "云南", "陕西", "甘肃", "青海", "广西", "内蒙古")
ROAD_SUFFIX = ("路", "街", "大道", "大街", "巷", "东路", "西路", "南路", "北路", "中路", "环路")
DISTRICT_SUFFIX = ("区", "县", "新区", "开发区", "镇")
BRAND_CHARS = ("华信鼎盛恒通新锐宏达博远金桥天成瑞丰中科海川九州东方卓越汇安泰联创永晟嘉禾启明云帆智达领航星辰"
               "万象宏图凯旋远航锦程蓝海优品乐享美佳润泽益康德胜盈科新元百川众合正泰")
INDUSTRY_ZH = ("科技", "贸易", "电子", "物流", "餐饮管理", "建筑工程", "信息技术", "医疗器械", "文化传媒", "食品",
               "机械设备", "新能源", "网络科技", "商贸", "环保科技", "生物科技", "供应链管理", "包装材料", "印刷",
               "汽车配件", "家居用品", "服装", "教育咨询", "农业发展", "精密制造", "化工", "智能装备", "软件")
CO_SUFFIX_ZH = ("有限公司", "股份有限公司", "有限责任公司", "集团有限公司", "商行", "工作室")
ADJ_ZH = ("高级", "优质", "加厚", "便携式", "智能", "无线", "不锈钢", "环保", "多功能", "进口", "标准", "工业级",
          "家用", "商用", "迷你", "大容量", "透明", "防水", "耐高温", "可调节", "折叠", "一次性", "静音")
NOUN_ZH = ("办公纸", "笔记本电脑", "墨盒", "显示器", "交换机", "矿泉水", "内存条", "U盘", "电源适配器", "办公椅",
           "硒鼓", "打印机", "路由器", "数据线", "鼠标", "键盘", "文件柜", "投影仪", "插座", "工具箱", "手套",
           "包装箱", "标签纸", "保温杯", "台灯", "螺丝", "轴承", "电缆", "胶带", "电池", "传感器", "水泵",
           "阀门", "滤芯", "茶叶", "大米", "食用油", "洗衣液", "纸巾", "咖啡豆", "服务费", "维修费", "运输费")
UNITS_ZH = ("个", "台", "箱", "件", "套", "包", "条", "支", "把", "盒", "米", "千克", "吨", "次", "项", "瓶")
WORDS_ZH = ("我们", "公司", "根据", "合同", "约定", "客户", "服务", "产品", "质量", "价格", "付款", "发票", "订单",
            "交付", "时间", "地址", "联系", "负责", "确认", "通知", "项目", "进度", "安排", "会议", "讨论", "决定",
            "相关", "部门", "管理", "规定", "要求", "提供", "资料", "完成", "工作", "计划", "预算", "费用", "报销",
            "审核", "批准", "签字", "盖章", "有效", "期限", "范围", "条款", "双方", "协商", "解决", "问题", "情况",
            "说明", "如下", "以上", "特此", "感谢", "支持", "配合", "及时", "准确", "信息", "系统", "升级", "维护",
            "数据", "安全", "保密", "责任", "义务", "权利", "变更", "取消", "延期", "发货", "收货", "验收", "退货",
            "库存", "采购", "供应商", "物流", "运输", "仓库", "包装", "数量", "单价", "金额", "合计", "税率", "税额",
            "账户", "余额", "利息", "转账", "存款", "结算", "本月", "上月", "年度", "季度", "报告", "统计", "分析",
            "增长", "下降", "稳定", "市场", "销售", "业绩", "目标", "团队", "员工", "培训", "考核", "申请", "登记",
            "办理", "手续", "材料", "复印件", "原件", "身份证", "营业执照", "请于", "之前", "尽快", "务必", "另行",
            "今天", "明天", "上午", "下午", "已经", "正在", "需要", "可以", "应当", "不得", "如有", "疑问", "欢迎")
FIRST_EN = ("James", "Mary", "Robert", "Patricia", "John", "Jennifer", "Michael", "Linda", "David", "Elizabeth",
            "William", "Barbara", "Richard", "Susan", "Joseph", "Jessica", "Thomas", "Sarah", "Charles", "Karen",
            "Daniel", "Nancy", "Matthew", "Lisa", "Anthony", "Betty", "Mark", "Sandra", "Paul", "Ashley", "Steven",
            "Kimberly", "Andrew", "Emily", "Joshua", "Donna", "Kevin", "Michelle", "Brian", "Carol", "George",
            "Amanda", "Edward", "Melissa", "Ronald", "Deborah", "Timothy", "Stephanie", "Jason", "Rebecca", "Ryan",
            "Laura", "Jacob", "Helen", "Gary", "Sharon", "Nicholas", "Cynthia", "Eric", "Kathleen", "Wei", "Ming",
            "Hiroshi", "Priya", "Carlos", "Sofia", "Ahmed", "Olga", "Lucas", "Emma", "Yuki", "Fatima", "Ivan")
SYL_A = ("Bar", "Hol", "Kent", "Mar", "Wes", "Ash", "Bro", "Cal", "Dun", "Fair", "Gil", "Har", "Lang", "Mel",
         "Nor", "Pem", "Ros", "Sher", "Thorn", "Wil", "Ox", "Stan", "Brad", "Chester", "Dal", "Elm", "Fen", "Grey")
SYL_B = ("ton", "ford", "ley", "wood", "field", "man", "well", "ridge", "by", "worth", "more", "dale", "brook",
         "ham", "son", "stead", "wick", "ington", "er", "ett", "hurst", "mont", "ville", "port", "land", "burn")
STREET_SUFFIX = ("St", "Ave", "Rd", "Dr", "Ln", "Blvd", "Way", "Ct", "Pl", "Pkwy", "Terrace", "Street", "Road")
STATES = ("AL", "AZ", "CA", "CO", "CT", "FL", "GA", "IL", "IN", "MA", "MD", "MI", "MN", "MO", "NC", "NJ", "NY",
          "OH", "OR", "PA", "TN", "TX", "VA", "WA", "WI")
INDUSTRY_EN = ("Trading", "Logistics", "Software", "Electronics", "Supplies", "Consulting", "Foods", "Industries",
               "Design", "Systems", "Manufacturing", "Services", "Analytics", "Robotics", "Textiles", "Freight",
               "Materials", "Labs", "Energy", "Media", "Holdings", "Partners", "Instruments", "Packaging")
CO_SUFFIX_EN = ("Inc.", "LLC", "Ltd.", "Co.", "Corp.", "GmbH", "Pte. Ltd.", "Group", "& Sons", "S.A.", "B.V.")
ADJ_EN = ("Premium", "Heavy-duty", "Portable", "Wireless", "Compact", "Stainless", "Recycled", "Industrial",
          "Adjustable", "Foldable", "Ergonomic", "Waterproof", "Deluxe", "Standard", "Organic", "Smart", "Mini",
          "Large", "Insulated", "Rechargeable", "Matte", "Glossy", "Reinforced")
NOUN_EN = ("paper", "mouse", "cable", "monitor", "stand", "toner", "license", "switch", "lamp", "SSD", "chair",
           "webcam", "printer", "router", "keyboard", "cabinet", "projector", "socket", "toolkit", "gloves",
           "carton", "labels", "tumbler", "screws", "bearing", "sensor", "pump", "valve", "filter", "tea", "rice",
           "detergent", "tissues", "coffee beans", "battery pack", "adapter", "headset", "whiteboard", "tape")
WORDS_EN = ("the", "of", "and", "to", "in", "for", "on", "with", "as", "by", "at", "from", "this", "that", "we",
            "you", "your", "our", "please", "payment", "invoice", "order", "delivery", "account", "service",
            "agreement", "terms", "conditions", "date", "amount", "total", "balance", "due", "received", "shipment",
            "items", "quantity", "price", "customer", "support", "contact", "office", "meeting", "project",
            "schedule", "report", "review", "approval", "request", "information", "confirm", "attached", "copy",
            "within", "days", "business", "thank", "regards", "further", "questions", "policy", "update", "new",
            "current", "previous", "monthly", "annual", "quarter", "budget", "cost", "fee", "charges", "tax",
            "transfer", "statement", "period", "reference", "number", "issued", "signed", "valid", "until",
            "notice", "changes", "effective", "immediately", "team", "department", "manager", "director", "staff",
            "warehouse", "inventory", "supplier", "quality", "inspection", "returned", "goods", "pending",
            "processed", "completed", "scheduled", "additional", "required", "documents", "submit", "before",
            "after", "during", "will", "be", "is", "are", "has", "have", "been", "all", "any", "each", "per")
LATIN = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
UPPER = "ABCDEFGHJKLMNPQRSTUVWXYZ"
DIGITS = "0123456789"
PUNCT = ".,:;-/#()%&*+@"
CURRENCIES = (("¥", "CNY"), ("$", "USD"), ("€", "EUR"), ("£", "GBP"), ("HK$", "HKD"), ("S$", "SGD"))
DATE_FORMATS = ("iso", "zh", "us", "eu", "dot", "slash", "long_en", "short_en")
MONTHS_EN = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
             "November", "December")

LANGS = ("zh", "en", "mixed")


@dataclass
class Content:
    """Random values for one page; `lang` is "zh", "en" or "mixed" (each value in either)."""

    rng: np.random.Generator
    lang: str

    # ------------------------------------------------------------------ primitives
    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def n(self, lo: int, hi: int) -> int:
        """Integer in [lo, hi]."""
        return int(self.rng.integers(lo, hi + 1))

    def chars(self, pool: str, k: int) -> str:
        return "".join(pool[int(i)] for i in self.rng.integers(0, len(pool), k))

    def zh(self) -> bool:
        """Whether the next value is Chinese: always for zh pages, never for en, half the time for mixed."""
        return self.lang == "zh" or (self.lang == "mixed" and self.chance(0.5))

    def bi(self, zh: str, en: str) -> str:
        """A caption in the page's language; mixed pages often show both ("金额 Amount")."""
        if self.lang == "zh":
            return zh
        if self.lang == "en":
            return en
        return self.pick((zh, en, f"{zh} {en}", f"{zh}/{en}"))

    # ------------------------------------------------------------------ people, places, companies
    def name(self, zh: bool | None = None) -> str:
        if self.zh() if zh is None else zh:
            return self.pick(SURNAMES) + self.chars(GIVEN_CHARS, self.n(1, 2))
        first = self.pick(FIRST_EN)
        last = self.pick(SYL_A) + self.pick(SYL_B)
        return f"{first} {self.pick(UPPER)}. {last}" if self.chance(0.2) else f"{first} {last}"

    def city_zh(self) -> str:
        return self.chars(PLACE_CHARS, self.n(2, 2)) + "市"

    def address(self, zh: bool | None = None) -> list[str]:
        """One or two address lines."""
        if self.zh() if zh is None else zh:
            line = (f"{self.pick(PROVINCES)}省{self.city_zh()}{self.chars(PLACE_CHARS, 2)}{self.pick(DISTRICT_SUFFIX)}"
                    f"{self.chars(PLACE_CHARS, 2)}{self.pick(ROAD_SUFFIX)}{self.n(1, 1999)}号")
            if self.chance(0.5):
                return [line, f"{self.n(1, 30)}栋{self.n(1, 32)}{self.n(1, 20):02d}室"]
            return [line]
        street = f"{self.n(1, 9999)} {self.pick(SYL_A)}{self.pick(SYL_B)} {self.pick(STREET_SUFFIX)}"
        if self.chance(0.3):
            street += f", {self.pick(('Suite', 'Unit', 'Apt', 'Floor'))} {self.n(1, 999)}"
        city = f"{self.pick(SYL_A)}{self.pick(SYL_B)}, {self.pick(STATES)} {self.n(10000, 99999)}"
        return [street, city]

    def company(self, zh: bool | None = None) -> str:
        if self.zh() if zh is None else zh:
            return (self.chars(PLACE_CHARS, 2) + self.chars(BRAND_CHARS, 2) + self.pick(INDUSTRY_ZH)
                    + self.pick(CO_SUFFIX_ZH))
        a = self.pick(SYL_A) + self.pick(SYL_B)
        if self.chance(0.4):
            a += " " + self.pick(SYL_A) + self.pick(SYL_B)
        return f"{a} {self.pick(INDUSTRY_EN)} {self.pick(CO_SUFFIX_EN)}"

    def product(self, zh: bool | None = None) -> str:
        if self.zh() if zh is None else zh:
            s = (self.pick(ADJ_ZH) if self.chance(0.6) else "") + self.pick(NOUN_ZH)
        else:
            s = (self.pick(ADJ_EN) + " " if self.chance(0.7) else "") + self.pick(NOUN_EN)
            s = s[0].upper() + s[1:]
        if self.chance(0.45):
            s += " " + self.code(self.pick(("A9-99", "AA999", "A-9999", "999A", "AA-99A")))
        return s

    def unit(self) -> str:
        return self.pick(UNITS_ZH) if self.zh() else self.pick(("pcs", "box", "set", "kg", "m", "ea", "pack", "h"))

    # ------------------------------------------------------------------ numbers and codes
    def code(self, pattern: str) -> str:
        """A=upper letter, 9=digit, a=lower letter, anything else literal."""
        out = []
        for c in pattern:
            out.append(self.pick(UPPER) if c == "A" else self.pick(DIGITS) if c == "9"
                       else self.pick(LATIN[26:]) if c == "a" else c)
        return "".join(out)

    def doc_number(self) -> str:
        return self.code(self.pick(("AA-99999999", "99999999", "AAA9999-9999", "NO.99999999", "99-AA-999999",
                                    "9999AA99999", "INV-9999-99999", "A999999999")))

    def phone(self) -> str:
        if self.zh():
            return self.pick((self.code("1" + self.pick("3456789") + "9-9999-9999"),
                              self.code("1" + self.pick("3578") + "999999999"), self.code("09999-9999999"),
                              self.code("099-99999999")))
        return self.pick((self.code("(999) 999-9999"), self.code("+1 999 999 9999"), self.code("999.999.9999"),
                          self.code("+44 99 9999 9999"), self.code("+86 999 9999 9999")))

    def email(self) -> str:
        user = self.pick((self.pick(SYL_A).lower() + self.pick(SYL_B), self.pick(FIRST_EN).lower(),
                          self.code("aaaa99"), "info", "sales", "billing", "service"))
        dom = self.pick(SYL_A).lower() + self.pick(SYL_B) + self.pick((".com", ".cn", ".com.cn", ".net", ".io", ".co"))
        return f"{user}@{dom}"

    def money(self, lo: float, hi: float) -> Decimal:
        """Amount with 2 decimals, log-uniform in [lo, hi]."""
        v = float(np.exp(self.rng.uniform(np.log(lo), np.log(hi))))
        return Decimal(str(round(v, 2))).quantize(Decimal("0.01"))

    def fmt_money(self, v: Decimal, style: int = 0) -> str:
        return f"{v:,.2f}" if style == 0 else f"{v:.2f}"

    def currency(self) -> tuple[str, str]:
        if self.lang == "zh":
            return CURRENCIES[0]
        return self.pick(CURRENCIES)

    def date(self, fmt: str | None = None) -> str:
        y, m, d = self.n(2015, 2027), self.n(1, 12), self.n(1, 28)
        fmt = fmt or (self.pick(("iso", "zh", "dot", "slash")) if self.zh() else self.pick(DATE_FORMATS))
        return {"iso": f"{y}-{m:02d}-{d:02d}", "zh": f"{y}年{m}月{d}日", "us": f"{m:02d}/{d:02d}/{y}",
                "eu": f"{d:02d}.{m:02d}.{y}", "dot": f"{y}.{m:02d}.{d:02d}", "slash": f"{y}/{m:02d}/{d:02d}",
                "long_en": f"{MONTHS_EN[m - 1]} {d}, {y}", "short_en": f"{d} {MONTHS_EN[m - 1][:3]} {y}"}[fmt]

    def time(self) -> str:
        return f"{self.n(0, 23):02d}:{self.n(0, 59):02d}" + (f":{self.n(0, 59):02d}" if self.chance(0.5) else "")

    def account(self) -> str:
        return self.pick((" ".join(self.code("9999") for _ in range(self.n(4, 5))),
                          self.code("AA99 9999 9999 9999 9999 99"), self.code("9999999999999999999"),
                          self.code("999-999999-999")))

    # ------------------------------------------------------------------ running text
    def sentence(self, zh: bool | None = None, words: tuple[int, int] = (6, 16)) -> str:
        k = self.n(*words)
        if self.zh() if zh is None else zh:
            parts = []
            for i in range(k):
                w = self.pick(WORDS_ZH)
                if self.chance(0.08):
                    w = self.pick((str(self.n(1, 9999)), self.date("zh"), self.code("AA99"), self.pick(NOUN_ZH)))
                parts.append(w)
                if i < k - 1 and self.chance(0.15):
                    parts.append("，")
            return "".join(parts) + self.pick(("。", "。", "；", "！"))
        ws = []
        for _ in range(k):
            w = self.pick(WORDS_EN)
            if self.chance(0.08):
                w = self.pick((str(self.n(1, 9999)), self.date("short_en"), self.code("AA-999"), self.pick(NOUN_EN)))
            ws.append(w)
        s = " ".join(ws)
        return s[0].upper() + s[1:] + self.pick((".", ".", ".", ";", "!"))

    def paragraph(self, sentences: tuple[int, int] = (2, 5)) -> str:
        zh = self.zh()
        sep = "" if zh else " "
        return sep.join(self.sentence(zh) for _ in range(self.n(*sentences)))

    def random_token(self, cjk_pool: str) -> str:
        """A word no language prior predicts: random CJK characters, digits, letters, codes."""
        r = self.rng.random()
        if self.lang != "en" and r < 0.4:
            return self.chars(cjk_pool, self.n(1, 6))
        if r < 0.65:
            s = self.chars(DIGITS, self.n(1, 11))
            return s[:-2] + "." + s[-2:] if len(s) > 3 and self.chance(0.3) else s
        if r < 0.85:
            s = self.chars(LATIN, self.n(1, 9))
        else:
            s = self.code(self.pick(("AA-999", "A9A9", "999/99", "99:99", "AAA_99", "a9a9a9")))
        if self.chance(0.15):
            s += self.pick(PUNCT)
        return s


# Characters of random reading tokens: the pools above plus common characters outside them.
READING_EXTRA = ("的一是不了人在有这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么"
                 "心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样"
                 "现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打"
                 "便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总"
                 "才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王"
                 "果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科")


def reading_charset() -> str:
    """CJK characters random reading lines draw from (deduplicated, sorted: independent of pool order)."""
    pool = GIVEN_CHARS + PLACE_CHARS + BRAND_CHARS + SURNAMES + READING_EXTRA + "".join(WORDS_ZH)
    return "".join(sorted({c for c in pool if ord(c) > 0x2E80}))
