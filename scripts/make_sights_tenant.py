#!/usr/bin/env python3
"""A tenant of another shape than the demo's, for checking the own-tenant path end to end: a travel service's
Chinese dialogue about sights, over a KB of one document per sight whose title is the sight's name (no "entity +
aspect" titles, so the embedded `resolve` teacher does not fit it), with people's rewrites in the sheet.

It writes the two files a user brings, where the README puts them:

    python scripts/make_sights_tenant.py                 # data/raw/sights.xlsx + data/kb/sights.jsonl
    .venv/bin/qrewrite tenant init sights --excel data/raw/sights.xlsx --kb data/kb/sights.jsonl

The facts are synthetic (seeded, written here; no real opening hours or prices): what matters is the shape. A
question leaves the sight to the history ("它几点开门"), the history often names two sights (the question means
the last one) and names a sight by a short name ("故宫" for 故宫博物院) as people do; the gold document is the
sight's, and the sheet's 参考改写 column is what a person would rewrite the question to.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from qrewrite.io_utils import publish_changed

# (name, short name people use, city)
SIGHTS = [
    ("故宫博物院", "故宫", "北京"), ("八达岭长城", "长城", "北京"), ("颐和园", "颐和园", "北京"), ("天坛公园", "天坛", "北京"),
    ("圆明园遗址公园", "圆明园", "北京"), ("北海公园", "北海", "北京"), ("恭王府", "恭王府", "北京"),
    ("外滩", "外滩", "上海"), ("豫园", "豫园", "上海"), ("东方明珠广播电视塔", "东方明珠", "上海"), ("上海博物馆", "上博", "上海"),
    ("西湖", "西湖", "杭州"), ("灵隐寺", "灵隐寺", "杭州"), ("雷峰塔", "雷峰塔", "杭州"), ("千岛湖", "千岛湖", "杭州"),
    ("拙政园", "拙政园", "苏州"), ("虎丘", "虎丘", "苏州"), ("留园", "留园", "苏州"), ("周庄古镇", "周庄", "苏州"),
    ("秦始皇帝陵博物院", "兵马俑", "西安"), ("大雁塔", "大雁塔", "西安"), ("西安城墙", "城墙", "西安"),
    ("华清宫", "华清池", "西安"), ("成都大熊猫繁育研究基地", "熊猫基地", "成都"), ("宽窄巷子", "宽窄巷子", "成都"),
    ("都江堰景区", "都江堰", "成都"), ("武侯祠", "武侯祠", "成都"), ("黄鹤楼", "黄鹤楼", "武汉"),
    ("东湖风景区", "东湖", "武汉"), ("岳麓山", "岳麓山", "长沙"), ("橘子洲", "橘子洲头", "长沙"),
    ("鼓浪屿", "鼓浪屿", "厦门"), ("南普陀寺", "南普陀", "厦门"), ("漓江", "漓江", "桂林"), ("象鼻山", "象鼻山", "桂林"),
    ("黄山风景区", "黄山", "黄山"), ("宏村", "宏村", "黄山"), ("泰山风景区", "泰山", "泰安"), ("曲阜三孔", "三孔", "曲阜"),
    ("趵突泉", "趵突泉", "济南"), ("崂山", "崂山", "青岛"), ("栈桥", "栈桥", "青岛"), ("中山陵", "中山陵", "南京"),
    ("夫子庙", "夫子庙", "南京"), ("玄武湖", "玄武湖", "南京"), ("张家界国家森林公园", "张家界", "张家界"),
    ("凤凰古城", "凤凰古城", "湘西"), ("九寨沟", "九寨沟", "阿坝"), ("峨眉山", "峨眉山", "乐山"), ("乐山大佛", "大佛", "乐山"),
    ("布达拉宫", "布达拉宫", "拉萨"), ("大昭寺", "大昭寺", "拉萨"), ("洱海", "洱海", "大理"), ("丽江古城", "丽江古城", "丽江"),
    ("玉龙雪山", "玉龙雪山", "丽江"), ("石林风景区", "石林", "昆明"), ("莫高窟", "莫高窟", "敦煌"), ("鸣沙山月牙泉", "月牙泉", "敦煌"),
    ("天涯海角", "天涯海角", "三亚"), ("亚龙湾", "亚龙湾", "三亚"),
]
# (aspect, question forms that leave the sight out, how the rewrite names it)
ASPECTS = [
    ("开放时间", ["它几点开门", "那边几点关门啊", "那里周一开放吗", "几点能进去"], "几点开门"),
    ("门票", ["门票多少钱", "那儿的票贵不贵", "学生票怎么买", "要提前预约门票吗"], "门票多少钱"),
    ("交通", ["怎么过去比较方便", "坐地铁能到吗", "从火车站过去远吗", "那边好停车吗"], "怎么去"),
    ("季节", ["什么时候去最好", "冬天去合适吗", "几月份人少", "下雨天值得去吗"], "什么季节去最好"),
    ("游览", ["一般要玩多久", "有什么必看的", "带老人去累不累", "里面有讲解吗"], "怎么游览"),
]
PROFILES = ["", "", "带孩子的家长", "大学生", "退休老人", "第一次来的外地游客", "摄影爱好者", "情侣"]


def documents(rng: random.Random) -> list[dict]:
    docs = []
    for i, (name, short, city) in enumerate(SIGHTS):
        open_h, close_h = rng.choice([(8, 17), (8, 18), (9, 17), (7, 19), (8, 20)])
        price = rng.choice([0, 30, 40, 60, 80, 120, 150, 180, 200])
        closed = rng.choice(["全年无休", "周一闭馆（法定节假日除外）", "周二闭园维护"])
        metro = rng.choice(["地铁可直达", "乘地铁后步行约十分钟", "需换乘公交", "建议自驾或包车"])
        season = rng.choice(["春秋两季", "夏季", "秋季", "冬季雪后", "四到十月"])
        hours = rng.choice([2, 3, 4, 6])
        content = (f"{name}位于{city}，是当地著名景点，游客常简称{short}。开放时间：{open_h}:00-{close_h}:00，{closed}。"
                   f"门票：{'免费，需实名预约' if price == 0 else f'{price}元，学生半价，需提前在线预约'}。"
                   f"交通：{metro}，景区附近停车位紧张。最佳游览季节：{season}，节假日人流量大。"
                   f"游览建议：一般需要{hours}小时左右，提供人工讲解和语音导览，适合各年龄段游客。")
        docs.append({"id": f"sight-{i:03d}", "title": name, "text": content})
    return docs


def rows(rng: random.Random, n: int) -> list[dict]:
    out = []
    for k in range(n):
        i = rng.randrange(len(SIGHTS))
        name, short, city = SIGHTS[i]
        aspect, forms, named = ASPECTS[rng.randrange(len(ASPECTS))]
        form = rng.choice(forms)
        mention = short if rng.random() < 0.6 else name
        kind = rng.random()
        if kind < 0.15:  # self-contained: the sight is in the question itself
            query, history = f"{mention}{form.lstrip('它那边那里那儿')}", ""
        elif kind < 0.55:  # the history names another sight first, then this one: the question means the last
            j = (i + 1 + rng.randrange(len(SIGHTS) - 1)) % len(SIGHTS)
            other = SIGHTS[j][1] if rng.random() < 0.6 else SIGHTS[j][0]
            history = rng.choice([f"用户先问了{other}的情况，又说想去{mention}看看",
                                  f"用户在比较{other}和{mention}，最后决定去{mention}",
                                  f"用户刚去过{other}，下一站打算去{mention}"])
            query = form
        else:
            history = rng.choice([f"用户说这次去{city}主要想逛{mention}", f"用户在问{mention}的攻略",
                                  f"用户计划周末去{mention}"])
            query = form
        out.append({"问题": query, "用户画像": rng.choice(PROFILES), "对话历史": history,
                    "相关文档": f"sight-{i:03d}", "参考改写": f"{name}{named}" if form not in forms[1:] else
                    f"{name}{form.lstrip('它那边那里那儿')}"})
    return out


def publish(path: Path, write) -> None:
    """Write `path` through `write(tmp_path)`, leaving it untouched (its mtime too) where the bytes are the same."""
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        write(Path(tmp) / path.name)
        publish_changed(tmp, path.parent)


def write_xlsx(path: Path, table: list[dict]) -> None:
    import openpyxl

    from qrewrite.data.excel import _FIXED_TIME, _pin_zip_times

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "对话"
    header = list(table[0])
    ws.append(header)
    for r in table:
        ws.append([r[h] for h in header])
    wb.properties.created = wb.properties.modified = _FIXED_TIME  # the same bytes every run

    def save(p: Path) -> None:
        wb.save(p)
        _pin_zip_times(p)

    publish(path, save)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--excel", type=Path, default=Path("data/raw/sights.xlsx"))
    ap.add_argument("--kb", type=Path, default=Path("data/kb/sights.jsonl"))
    ap.add_argument("--rows", type=int, default=150, help="rows of the sheet (default 150)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    docs = documents(rng)
    table = rows(rng, args.rows)
    for p in (args.excel, args.kb):
        p.parent.mkdir(parents=True, exist_ok=True)
    publish(args.kb, lambda p: p.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs),
                                            encoding="utf-8"))
    write_xlsx(args.excel, table)
    print(f"wrote {args.excel} ({len(table)} rows) and {args.kb} ({len(docs)} sights)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
