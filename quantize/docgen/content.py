"""Synthetic but realistic field values: names, companies, addresses, amounts, dates, phone numbers,
IDs with valid check digits (all fake), uppercase RMB amounts."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

SURNAMES = "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏吕丁任沈姚卢姜崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵万钱严覃武戴莫孔向汤"
GIVEN = "伟芳娜秀英敏静丽强磊军洋勇艳杰娟涛明超秀兰霞平刚桂英华玉萍红娥玲芬燕彬鹏辉建国志强晓东海波宇航子涵欣怡浩然梓萱雨桐一鸣思远佳琪"
FIRST_EN = ["James", "Mary", "Robert", "Patricia", "John", "Jennifer", "Michael", "Linda", "David", "Elizabeth",
            "William", "Barbara", "Richard", "Susan", "Joseph", "Jessica", "Thomas", "Sarah", "Charles", "Karen",
            "Daniel", "Nancy", "Matthew", "Lisa", "Anthony", "Betty", "Mark", "Sandra", "Paul", "Ashley", "Wei",
            "Li", "Hiroshi", "Priya", "Carlos", "Sofia", "Ahmed", "Olga", "Lucas", "Emma"]
LAST_EN = ["Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis", "Rodriguez", "Martinez",
           "Hernandez", "Lopez", "Wilson", "Anderson", "Thomas", "Taylor", "Moore", "Jackson", "Martin", "Lee",
           "Thompson", "White", "Harris", "Clark", "Lewis", "Walker", "Hall", "Young", "King", "Wright", "Chen",
           "Wang", "Tanaka", "Patel", "Nguyen", "Kim", "Schmidt", "Rossi", "Dubois", "Silva"]
CITIES_ZH = ["北京市", "上海市", "广州市", "深圳市", "杭州市", "南京市", "成都市", "武汉市", "西安市", "重庆市",
             "苏州市", "天津市", "长沙市", "郑州市", "青岛市", "厦门市", "宁波市", "合肥市", "昆明市", "大连市"]
DISTRICTS_ZH = ["朝阳区", "海淀区", "浦东新区", "天河区", "南山区", "西湖区", "鼓楼区", "武侯区", "江汉区", "雁塔区",
                "渝中区", "高新区", "经济开发区", "福田区", "滨江区"]
ROADS_ZH = ["人民路", "中山路", "解放路", "建设大道", "科技园路", "长江路", "黄河路", "新华街", "文化路", "和平路",
            "东风路", "世纪大道", "创业路", "湖滨路", "望京街"]
CO_PREFIX_ZH = ["华信", "鼎盛", "恒通", "新锐", "宏达", "博远", "金桥", "天成", "瑞丰", "中科", "海川", "九州",
                "东方", "卓越", "汇丰", "安泰", "联创", "永盛"]
CO_FIELD_ZH = ["科技", "贸易", "电子", "物流", "餐饮管理", "建筑工程", "信息技术", "医疗器械", "文化传媒", "食品",
               "机械设备", "新能源", "网络科技", "商贸"]
CO_SUFFIX_ZH = ["有限公司", "股份有限公司", "有限责任公司"]
CO_EN_A = ["Apex", "Blue River", "Northwind", "Summit", "Golden Gate", "Pioneer", "Evergreen", "Silverline",
           "Atlas", "Harbor", "Redwood", "Crescent", "Maple", "Vertex", "Orion", "Cedar"]
CO_EN_B = ["Trading", "Logistics", "Software", "Electronics", "Supplies", "Consulting", "Foods", "Industries",
           "Design", "Systems", "Manufacturing", "Services"]
CO_EN_C = ["Inc.", "LLC", "Ltd.", "Co.", "Corp.", "GmbH", "Pte. Ltd."]
STREETS_EN = ["Main St", "Oak Ave", "Pine Rd", "Maple Dr", "Cedar Ln", "Elm St", "Market St", "Broadway",
              "Sunset Blvd", "Lake View Rd", "Park Ave", "2nd Ave", "Harbor Way", "Industrial Pkwy"]
CITIES_EN = [("Springfield", "IL", "62701"), ("Austin", "TX", "78701"), ("Portland", "OR", "97201"),
             ("Denver", "CO", "80202"), ("Seattle", "WA", "98101"), ("Boston", "MA", "02108"),
             ("San Jose", "CA", "95113"), ("Madison", "WI", "53703"), ("Raleigh", "NC", "27601"),
             ("Columbus", "OH", "43215"), ("Phoenix", "AZ", "85004"), ("Atlanta", "GA", "30303")]
GOODS_ZH = [("办公用纸", "A4 70g", "箱"), ("笔记本电脑", "ThinkPad E14", "台"), ("打印机墨盒", "HP 803", "个"),
            ("技术服务费", "", "项"), ("显示器", "27英寸", "台"), ("网络交换机", "S1720-28GWR", "台"),
            ("矿泉水", "550ml*24", "箱"), ("咨询服务", "", "次"), ("服务器内存", "DDR4 32G", "条"),
            ("会议服务费", "", "项"), ("U盘", "64GB", "个"), ("电源适配器", "65W", "个"), ("运输服务", "", "次"),
            ("软件许可", "年度订阅", "套"), ("办公椅", "人体工学", "把"), ("硒鼓", "CF226A", "支")]
GOODS_EN = ["Office paper A4 (box)", "Wireless mouse", "USB-C cable 2m", "Consulting services (hours)",
            "Laptop stand", "Printer toner", "Monitor 27\"", "Software license", "Shipping & handling",
            "Network switch 24-port", "Desk lamp LED", "External SSD 1TB", "Maintenance fee", "Webcam HD",
            "Ergonomic chair", "Cloud hosting (month)", "Training session", "Label printer"]
DISHES_ZH = [("宫保鸡丁", "Kung Pao Chicken"), ("麻婆豆腐", "Mapo Tofu"), ("鱼香肉丝", "Yu Xiang Pork"),
             ("清蒸鲈鱼", "Steamed Sea Bass"), ("红烧肉", "Braised Pork Belly"), ("蒜蓉西兰花", "Garlic Broccoli"),
             ("酸辣汤", "Hot and Sour Soup"), ("扬州炒饭", "Yangzhou Fried Rice"), ("牛肉面", "Beef Noodle Soup"),
             ("小笼包", "Soup Dumplings"), ("北京烤鸭", "Peking Duck"), ("糖醋里脊", "Sweet and Sour Pork"),
             ("回锅肉", "Twice-cooked Pork"), ("水煮鱼", "Boiled Fish in Chili Oil"), ("凉拌黄瓜", "Cucumber Salad"),
             ("珍珠奶茶", "Bubble Milk Tea"), ("柠檬茶", "Lemon Tea"), ("绿茶", "Green Tea"), ("可乐", "Cola")]
SHOP_ITEMS = [("牛奶", "Milk 1L"), ("面包", "Bread"), ("鸡蛋", "Eggs x12"), ("苹果", "Apples"), ("香蕉", "Bananas"),
              ("大米", "Rice 5kg"), ("酱油", "Soy Sauce"), ("洗发水", "Shampoo"), ("纸巾", "Tissues"),
              ("矿泉水", "Water 550ml"), ("咖啡", "Coffee"), ("巧克力", "Chocolate"), ("酸奶", "Yogurt"),
              ("牙膏", "Toothpaste"), ("电池", "Batteries AA"), ("橙汁", "Orange Juice")]

DIGITS_UPPER = "零壹贰叁肆伍陆柒捌玖"
UNITS_UPPER = ["", "拾", "佰", "仟"]
SECTIONS_UPPER = ["", "万", "亿"]


def rmb_uppercase(amount: Decimal) -> str:
    """Chinese uppercase amount as written on invoices: 1004 -> 壹仟零肆圆整, 100500.3 -> 壹拾万零伍佰圆叁角整."""
    amount = Decimal(amount).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    if amount < 0:
        raise ValueError("negative amount")
    cents = int(amount * 100)
    yuan, jiao, fen = cents // 100, (cents // 10) % 10, cents % 10
    out = ""
    if yuan:
        s, zero = str(yuan), False
        for i, ch in enumerate(s):
            pos, d = len(s) - 1 - i, int(ch)
            if d == 0:
                zero = True
            else:
                out += ("零" if zero else "") + DIGITS_UPPER[d] + UNITS_UPPER[pos % 4]
                zero = False
            if pos % 4 == 0 and pos > 0 and int(s[max(0, i - 3): i + 1]) != 0:
                out += SECTIONS_UPPER[pos // 4]
        out += "圆"
    if jiao == 0 and fen == 0:
        return (out or "零圆") + "整"
    if jiao:
        out += DIGITS_UPPER[jiao] + "角"
    elif yuan:
        out += "零"
    return out + (DIGITS_UPPER[fen] + "分" if fen else "整")


def cn_id_check(first17: str) -> str:
    """GB 11643 (ISO 7064 MOD 11-2) check character of an 18-digit resident ID."""
    weights = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2]
    s = sum(int(c) * w for c, w in zip(first17, weights))
    return "10X98765432"[s % 11]


def fake_cn_id(rng, birth: str) -> str:
    """A structurally valid but fake ID number: region 999xxx does not exist."""
    first = f"99{rng.integers(1000, 9999)}{birth}{rng.integers(100, 999)}"
    return first + cn_id_check(first)


def mrz_check(s: str) -> str:
    """ICAO 9303 check digit."""
    val = {**{str(i): i for i in range(10)}, **{chr(65 + i): 10 + i for i in range(26)}, "<": 0}
    return str(sum(val[c] * (7, 3, 1)[i % 3] for i, c in enumerate(s)) % 10)


def uscc_check(code17: str) -> str:
    """GB 32100 unified social credit code check character."""
    chars = "0123456789ABCDEFGHJKLMNPQRTUWXY"
    w = [1, 3, 9, 27, 19, 26, 16, 17, 20, 29, 25, 13, 8, 24, 10, 30, 28]
    s = sum(chars.index(c) * wi for c, wi in zip(code17, w))
    return chars[(31 - s % 31) % 31]


def fake_uscc(rng) -> str:
    chars = "0123456789ABCDEFGHJKLMNPQRTUWXY"
    body = "91" + "".join(str(rng.integers(0, 10)) for _ in range(6)) + "".join(
        chars[rng.integers(0, 31)] for _ in range(9))
    return body + uscc_check(body)


def pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def name_zh(rng) -> str:
    return pick(rng, SURNAMES) + "".join(pick(rng, GIVEN) for _ in range(int(rng.integers(1, 3))))


def name_en(rng) -> str:
    return f"{pick(rng, FIRST_EN)} {pick(rng, LAST_EN)}"


def company_zh(rng) -> str:
    return pick(rng, CITIES_ZH)[:-1] + pick(rng, CO_PREFIX_ZH) + pick(rng, CO_FIELD_ZH) + pick(rng, CO_SUFFIX_ZH)


def company_en(rng) -> str:
    return f"{pick(rng, CO_EN_A)} {pick(rng, CO_EN_B)} {pick(rng, CO_EN_C)}"


def address_zh(rng) -> str:
    return f"{pick(rng, CITIES_ZH)}{pick(rng, DISTRICTS_ZH)}{pick(rng, ROADS_ZH)}{rng.integers(1, 999)}号"


def address_en(rng) -> tuple[str, str]:
    city, st, zipc = pick(rng, CITIES_EN)
    return f"{rng.integers(10, 9999)} {pick(rng, STREETS_EN)}", f"{city}, {st} {zipc}"


def phone_cn(rng) -> str:
    return f"1{pick(rng, '3578')}{rng.integers(0, 10)}-{rng.integers(0, 10000):04d}-{rng.integers(0, 10000):04d}"


def landline_cn(rng) -> str:
    return f"0{rng.integers(10, 999)}-{rng.integers(10000000, 99999999)}"


def phone_us(rng) -> str:
    return f"({rng.integers(200, 999)}) 555-{rng.integers(0, 10000):04d}"


def date(rng, fmt: str = "iso") -> str:
    y, m, d = int(rng.integers(2019, 2027)), int(rng.integers(1, 13)), int(rng.integers(1, 29))
    return {"iso": f"{y}-{m:02d}-{d:02d}", "zh": f"{y}年{m:02d}月{d:02d}日", "us": f"{m:02d}/{d:02d}/{y}",
            "dot": f"{y}.{m:02d}.{d:02d}"}[fmt]


def money(rng, lo: float, hi: float) -> Decimal:
    return Decimal(str(round(float(rng.uniform(lo, hi)), 2))).quantize(Decimal("0.01"))


def fmt_money(v: Decimal, sep: bool = True) -> str:
    return f"{v:,.2f}" if sep else f"{v:.2f}"


def bank_account(rng) -> str:
    return " ".join(f"{rng.integers(0, 10000):04d}" for _ in range(4)) + f" {rng.integers(0, 1000):03d}"
