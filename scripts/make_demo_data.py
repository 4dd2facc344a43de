#!/usr/bin/env python3
"""Deterministic generator for the Chinese demo data of two tenants.

Writes:
  data/kb/fivedoctors.jsonl        knowledge base of an invented supplement brand (五医生)
  data/kb/chengla.jsonl            knowledge base of an invented education company (橙啦教育)
  data/demo/fivedoctors.queries.jsonl
  data/demo/chengla.queries.jsonl

All content is original and invented. Documents are built from hand-written,
per-product / per-course facts slotted into one frame per aspect, so that each
document is identified by (product or course name) + (aspect vocabulary).
Queries are drawn from templates with a seeded RNG:
  * fully specified queries name the product/course (sometimes with a typo or
    homophone, sometimes colloquially);
  * underspecified queries omit it, and only the profile and/or history resolve it;
  * general policy queries target tenant-wide docs (refunds, shipping, ...).

Standard library only. Running it again reproduces the committed files exactly:
    python scripts/make_demo_data.py
    python scripts/make_demo_data.py --out-root /tmp/x   # writes /tmp/x/data/..., to compare with cmp
"""
from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = 20240611
N_QUERIES = 240
N_DUPLICATES = 4

# ---------------------------------------------------------------------------
# fivedoctors: 五医生 health supplements
# ---------------------------------------------------------------------------
FD_BRAND = "五医生"

# Each product: key, name, aliases (clean short names), typos (misspellings /
# homophones of the name), and the facts slotted into the aspect frames.
FD_PRODUCTS = [
    dict(
        key="fishoil", name="深海鱼油软胶囊", aliases=["鱼油", "深海鱼油", "鱼油胶囊"],
        typos=["鱼由", "深海鱼由", "鱼游胶囊"],
        spec="1000mg×90粒/瓶",
        ingr="每粒含鱼油1000mg，其中EPA 360mg、DHA 240mg，原料为秘鲁凤尾鱼，经分子蒸馏去除重金属",
        effect="有助于维持血脂健康水平，适合平时很少吃深海鱼的人补充Omega-3",
        excip="明胶、甘油、纯化水、天然维生素E",
        dose="成人每日2次，每次1粒，温水整粒吞服，不要咬破",
        timing="随午餐或晚餐一起吃，与含脂肪的食物同服吸收更好",
        tip="如有鱼腥味返嗝，可把鱼油放冰箱冷藏后再吃",
        course="8到12周",
        suit="血脂偏高者、中老年人、久坐少动的上班族",
        avoid="对鱼类或海产品过敏者、凝血功能异常者",
        special="孕妇和哺乳期女性建议改选专门的孕期DHA产品；12岁以下儿童不宜；老人可按成人量服用",
        med="正在服用阿司匹林、华法林等抗凝药物者须先咨询医生，手术前一周停用",
        storage="密封，置于阴凉干燥处，避免阳光直射，夏季室温超过30℃建议放冰箱冷藏",
        shelf="24个月", opened="开封后建议3个月内吃完",
        spoil="胶囊粘连、破裂或有明显哈喇味",
    ),
    dict(
        key="folic", name="叶酸片", aliases=["叶酸", "孕期叶酸"],
        typos=["页酸片", "叶算片", "夜酸片"],
        spec="0.4mg×60片/瓶",
        ingr="每片含叶酸400微克（活性叶酸与普通叶酸各半），另含维生素B12 2.4微克",
        effect="用于备孕及孕早期补充叶酸，有助于降低胎儿神经管缺陷风险",
        excip="微晶纤维素、乳糖、硬脂酸镁",
        dose="每日1次，每次1片，温水送服",
        timing="早餐后服用，固定时间每天吃，避免漏服",
        tip="建议从备孕前3个月开始吃，一直吃到孕12周，之后遵医嘱",
        course="至少3个月",
        suit="备孕女性、孕早期准妈妈、饮食中绿叶蔬菜偏少的成年人",
        avoid="对叶酸成分过敏者、恶性贫血未明确诊断者",
        special="孕妇和哺乳期妈妈是主要适用人群，按每日1片即可；儿童不需要额外补充；老人可遵医嘱服用",
        med="正在服用抗癫痫药、甲氨蝶呤等药物者，服用前请咨询医生",
        storage="密封，置于25℃以下干燥处，防潮避光，不需要放冰箱",
        shelf="36个月", opened="开瓶后请盖紧瓶盖并放回干燥剂，6个月内吃完",
        spoil="药片变色、受潮发软",
    ),
    dict(
        key="calcium", name="钙维D咀嚼片", aliases=["钙片", "钙维D", "咀嚼钙片"],
        typos=["盖片", "该维D咀嚼片", "盖维D片"],
        spec="1.2g×60片/瓶，牛奶味",
        ingr="每片含钙300mg（碳酸钙来源）和维生素D3 200IU，维生素D能促进钙吸收",
        effect="补充钙和维生素D，有助于骨骼和牙齿健康",
        excip="山梨糖醇、奶粉、柠檬酸、硬脂酸镁",
        dose="成人每日1至2片，嚼碎后咽下，也可用温水送服",
        timing="饭后半小时内吃吸收较好，晚饭后吃一片更佳",
        tip="不要与浓茶、菠菜等含草酸多的食物同时吃",
        course="3个月",
        suit="中老年人、青少年、绝经后女性及牛奶摄入少的人群",
        avoid="高钙血症、肾结石患者",
        special="孕妇和哺乳期可在医生指导下每日1片；4岁以上儿童每日半片至1片；老人每日2片",
        med="正在服用四环素类抗生素或甲状腺素者，应与钙片间隔2小时以上",
        storage="密封，阴凉干燥处保存，咀嚼片易吸潮，用后立即拧紧瓶盖",
        shelf="24个月", opened="开封后建议4个月内吃完",
        spoil="片剂发软、有异味或表面出现斑点",
    ),
    dict(
        key="probiotic", name="益生菌粉", aliases=["益生菌", "益生菌冲剂"],
        typos=["益生君", "亦生菌粉", "益声菌粉"],
        spec="2g×30袋/盒",
        ingr="每袋含活菌数不低于200亿CFU，包括动物双歧杆菌、鼠李糖乳杆菌、嗜酸乳杆菌，添加低聚果糖",
        effect="有助于调节肠道菌群，改善偶发的便秘或腹泻，促进消化",
        excip="低聚果糖、麦芽糊精、脱脂奶粉",
        dose="成人每日1至2袋，倒入不超过40℃的温水或牛奶中冲服",
        timing="早饭后或餐中冲服，水温过高会杀死活菌",
        tip="如同时吃抗生素，需间隔2小时以上再冲益生菌",
        course="2到4周",
        suit="肠胃功能较弱、饮食不规律、经常便秘或腹泻的人群",
        avoid="免疫功能严重低下者、对牛奶蛋白过敏者",
        special="孕妇和哺乳期可以吃，每日1袋；3岁以上儿童每日半袋到1袋；老人每日1袋即可",
        med="正在服用抗生素的人群可以吃，但务必与抗生素间隔2小时",
        storage="常温可保存，但建议冷藏在2到8℃冰箱中，活菌存活率更高，避免受潮",
        shelf="18个月", opened="单袋撕开后请立即冲服，不要分次",
        spoil="粉末结块、变色",
    ),
    dict(
        key="coq10", name="辅酶Q10软胶囊", aliases=["辅酶Q10", "Q10", "辅酶"],
        typos=["辅霉Q10", "付酶Q10", "辅梅Q10"],
        spec="100mg×60粒/瓶",
        ingr="每粒含辅酶Q10 100mg，采用发酵法制得，搭配大豆油提高溶解吸收",
        effect="有助于心肌细胞的能量代谢，具有抗氧化作用，适合关注心脏健康的人",
        excip="大豆油、明胶、甘油、蜂蜡",
        dose="成人每日1次，每次1粒",
        timing="随早餐或午餐服用，与油脂类食物同吃吸收更好，不建议睡前吃",
        tip="辅酶Q10起效较慢，需要坚持",
        course="至少8周",
        suit="40岁以上人群、经常疲劳的中年人、长期服用他汀类降脂药者",
        avoid="18岁以下未成年人、对大豆过敏者",
        special="孕妇和哺乳期女性缺乏安全性数据，不建议服用；儿童不宜；老人可正常服用",
        med="正在服用华法林或降压药者，辅酶Q10可能影响药效，需先咨询医生",
        storage="密封，置于阴凉干燥处，避光保存，无需冷藏",
        shelf="24个月", opened="开封后建议6个月内吃完",
        spoil="软胶囊变形、漏油或颜色明显变深",
    ),
    dict(
        key="vitc", name="维生素C泡腾片", aliases=["VC泡腾片", "维C泡腾片", "泡腾片"],
        typos=["维生素C泡藤片", "维C炮腾片", "维生素C跑腾片"],
        spec="4g×20片/支，橙子味",
        ingr="每片含维生素C 1000mg，另含柠檬酸、碳酸氢钠作为泡腾剂",
        effect="补充维生素C，有助于维持免疫力和抗氧化，换季时适合补充",
        excip="柠檬酸、碳酸氢钠、橙味香精、三氯蔗糖",
        dose="成人每日1片，放入200毫升凉水或温水中，完全溶解后饮用",
        timing="饭后饮用，胃不好的人不要空腹喝",
        tip="泡腾片千万不要直接放嘴里含服或吞服",
        course="需要时随时补充，连续饮用不超过1个月",
        suit="蔬果摄入不足者、换季容易感冒的人、吸烟人群",
        avoid="肾结石患者、胃溃疡患者、对柑橘类过敏者",
        special="孕妇和哺乳期每日不超过半片；6岁以下儿童不建议；老人需注意钠摄入，每日半片即可",
        med="正在服用降压药或限钠饮食的慢性病人群，请注意泡腾片中的钠含量",
        storage="密封防潮，每次取出后立即盖紧管盖，不要放冰箱",
        shelf="24个月", opened="开盖后建议1个月内喝完",
        spoil="药片受潮膨胀、表面发黄或冒泡变弱",
    ),
    dict(
        key="collagen", name="胶原蛋白肽粉", aliases=["胶原蛋白", "胶原蛋白肽", "胶原粉"],
        typos=["交原蛋白", "胶元蛋白肽", "娇原蛋白"],
        spec="5g×30袋/盒",
        ingr="每袋含鱼皮来源小分子胶原蛋白肽5000mg，添加维生素C 60mg和透明质酸钠",
        effect="补充胶原蛋白，有助于改善皮肤水分和弹性",
        excip="维生素C、透明质酸钠、水蜜桃粉",
        dose="每日1袋，倒入150毫升常温水、牛奶或果汁中搅拌溶解后饮用",
        timing="睡前或早晨空腹喝均可，不要用热水冲",
        tip="冲好后尽快喝完，不宜长时间放置",
        course="8周以上",
        suit="25岁以上关注皮肤状态的女性、经常熬夜的人",
        avoid="对鱼类过敏者、肾功能不全者",
        special="孕妇和哺乳期不建议服用；18岁以下青少年及儿童无需补充；老人可按量服用",
        med="患有慢性肾病需控制蛋白质摄入者，服用前请咨询医生",
        storage="常温干燥保存，避免高温和阳光直射，不需要冷藏",
        shelf="24个月", opened="单袋开封后当次喝完",
        spoil="粉末结块发黏或有腥臭味",
    ),
    dict(
        key="whey", name="乳清蛋白粉", aliases=["蛋白粉", "乳清蛋白"],
        typos=["蛋白份", "乳青蛋白", "乳清蛋白分"],
        spec="900g/罐，香草味，附量勺",
        ingr="每勺30g含蛋白质24g，以浓缩乳清蛋白和分离乳清蛋白为主，含支链氨基酸5.2g",
        effect="补充优质蛋白质，有助于运动后肌肉恢复，也适合蛋白质摄入不足的人",
        excip="大豆磷脂、香草香精、三氯蔗糖",
        dose="每日1至2勺，每勺用250毫升温水或牛奶摇匀",
        timing="运动后30分钟内喝一勺，另一勺可作为早餐补充",
        tip="水温不宜超过50℃，否则容易结块",
        course="配合训练长期食用",
        suit="健身和运动人群、术后恢复期成人、食欲差的中老年人",
        avoid="乳糖不耐受严重者、牛奶蛋白过敏者",
        special="孕妇和哺乳期可在营养师指导下少量补充；儿童不建议当日常饮品；老人每日1勺即可",
        med="肾功能不全、痛风或需限制蛋白质的慢性病患者请先咨询医生",
        storage="开罐后密封放在阴凉干燥处，量勺擦干后放回，不要放冰箱以免受潮",
        shelf="18个月", opened="开罐后建议2个月内吃完",
        spoil="粉末结块、变色或有酸味",
    ),
    dict(
        key="melatonin", name="褪黑素软糖", aliases=["褪黑素", "助眠软糖"],
        typos=["退黑素软糖", "腿黑素", "褪黑树软糖"],
        spec="2.5g×60粒/瓶，蓝莓味",
        ingr="每粒含褪黑素1.5mg，添加γ-氨基丁酸和酸枣仁提取物",
        effect="有助于改善睡眠，缩短入睡时间，倒时差时也可使用",
        excip="明胶、白砂糖、蓝莓浓缩汁、果胶",
        dose="成人每晚1粒，直接咀嚼",
        timing="睡前30分钟吃，吃完后不要再看手机",
        tip="不要和酒精一起服用，第二天如有困倦感可减为半粒",
        course="连续吃不超过2个月",
        suit="偶尔失眠、入睡困难、需要倒时差的成年人",
        avoid="18岁以下青少年、自身免疫性疾病患者、驾驶或高空作业前",
        special="孕妇和哺乳期禁止服用；儿童禁止服用；老人从半粒开始",
        med="正在服用安眠药、抗抑郁药或抗凝药者，服用褪黑素前请咨询医生",
        storage="软糖怕热，请密封放在25℃以下阴凉处，夏天可放冰箱冷藏防止粘连",
        shelf="18个月", opened="开封后建议2个月内吃完",
        spoil="软糖融化粘连、发霉",
    ),
    dict(
        key="lutein", name="叶黄素酯软胶囊", aliases=["叶黄素", "护眼叶黄素"],
        typos=["叶皇素", "页黄素", "叶黄数"],
        spec="500mg×60粒/瓶",
        ingr="每粒含叶黄素酯20mg（以万寿菊提取），添加玉米黄质4mg和蓝莓提取物",
        effect="有助于缓解视疲劳，过滤蓝光，保护黄斑健康",
        excip="葵花籽油、明胶、甘油",
        dose="成人每日1粒",
        timing="随餐服用，和含油脂的饭菜一起吃吸收更好",
        tip="护眼效果一般需要坚持吃一段时间才明显",
        course="3个月",
        suit="长时间看电脑手机的上班族、学生、中老年人",
        avoid="对万寿菊过敏者",
        special="孕妇和哺乳期可在医生指导下服用；4岁以下儿童不建议，学龄儿童每日半粒；老人可正常服用",
        med="正在吃降脂药或患有慢性病者，一般可以同服，有疑问可先咨询医生",
        storage="避光密封保存，叶黄素遇光易分解，请放在阴凉处，无需冷藏",
        shelf="24个月", opened="开封后建议3个月内吃完",
        spoil="胶囊褪色、漏油",
    ),
    dict(
        key="vitb", name="复合维生素B片", aliases=["维生素B", "维B", "B族维生素"],
        typos=["复合维他B片", "维生素币", "复合维生素逼片"],
        spec="60片/瓶",
        ingr="每片含维生素B1、B2、B6、B12、烟酰胺、泛酸、生物素和叶酸共8种B族维生素",
        effect="有助于能量代谢，缓解疲劳，改善口腔溃疡、嘴角干裂等情况",
        excip="微晶纤维素、羟丙甲纤维素、硬脂酸镁",
        dose="成人每日1次，每次1片",
        timing="早餐后吃，晚上吃可能影响睡眠",
        tip="服用后尿液变黄是B2代谢所致，属正常现象",
        course="1到2个月",
        suit="经常熬夜加班、饮酒应酬多、饮食不规律的成年人",
        avoid="对本品成分过敏者",
        special="孕妇和哺乳期请咨询医生后选择孕期专用配方；儿童不宜；老人可每日1片",
        med="正在服用左旋多巴等帕金森药物者，维生素B6可能影响药效，请咨询医生",
        storage="密封，置于阴凉干燥处，避光防潮",
        shelf="36个月", opened="开瓶后建议4个月内吃完",
        spoil="药片变色发黄斑或受潮",
    ),
    dict(
        key="kidzinc", name="儿童锌铁咀嚼片", aliases=["锌铁片", "儿童补锌片", "补锌补铁片"],
        typos=["儿童辛铁片", "儿童心铁片", "儿童锌贴片"],
        spec="0.8g×60片/瓶，草莓味",
        ingr="每片含锌3mg（葡萄糖酸锌）、铁4mg（焦磷酸铁）及维生素C 20mg",
        effect="为挑食、偏食的孩子补充锌和铁，有助于食欲和正常生长发育",
        excip="木糖醇、草莓粉、硬脂酸镁",
        dose="4至6岁每日1片，7至12岁每日2片，嚼碎后咽下",
        timing="饭后吃，避免空腹吃导致肠胃不适",
        tip="不要和牛奶、钙片同时吃，间隔1小时以上",
        course="1到2个月",
        suit="4到12岁挑食偏食、食欲不佳、面色偏黄的儿童",
        avoid="4岁以下婴幼儿、血色病或铁过载患儿",
        special="专为儿童设计，孕妇、哺乳期成人和老人不作为推荐人群，请选择成人配方",
        med="孩子正在服用抗生素或其他补铁药物时，请先咨询儿科医生",
        storage="密封置于阴凉干燥处，放在儿童拿不到的地方，以免孩子当糖果过量吃",
        shelf="24个月", opened="开封后建议3个月内吃完",
        spoil="片剂发软变色",
    ),
    dict(
        key="glucosamine", name="氨糖软骨素钙片", aliases=["氨糖", "氨糖软骨素"],
        typos=["安糖软骨素", "氨唐", "氨堂"],
        spec="1.0g×90片/瓶",
        ingr="每片含盐酸氨基葡萄糖500mg、硫酸软骨素100mg和钙150mg",
        effect="有助于维护关节软骨，增加骨密度，适合膝盖关节不适的人",
        excip="微晶纤维素、羧甲基纤维素钠",
        dose="成人每日3次，每次1片",
        timing="饭后吃，减少对胃的刺激",
        tip="需要坚持，关节改善感一般在1到2个月后出现",
        course="3个月为一个周期",
        suit="中老年人、膝关节或腰关节不适者、经常爬山跑步的人",
        avoid="对虾蟹等甲壳类过敏者，氨糖原料来自虾蟹壳",
        special="孕妇、哺乳期女性及儿童不宜服用；老人是主要适用人群",
        med="糖尿病患者请监测血糖，正在服用华法林等抗凝药者需先咨询医生",
        storage="密封，置于阴凉干燥处，防潮",
        shelf="36个月", opened="开封后建议4个月内吃完",
        spoil="片剂有异味或受潮",
    ),
    dict(
        key="algae", name="藻油DHA软胶囊", aliases=["藻油DHA", "DHA藻油", "孕妇DHA"],
        typos=["澡油DHA", "早油DHA", "藻由DHA"],
        spec="300mg×30粒/瓶",
        ingr="每粒含DHA 100mg，来源于裂壶藻，不含EPA，无鱼腥味",
        effect="补充DHA，有助于胎儿和婴幼儿大脑及视网膜发育",
        excip="葵花籽油、明胶、甘油、迷迭香提取物",
        dose="孕妇和哺乳期每日1至2粒；3岁以上儿童每日1粒，可剪开挤出食用",
        timing="随餐吃，早餐或午餐时均可",
        tip="孕中期开始吃效果更好",
        course="孕中期到哺乳期持续服用",
        suit="孕中晚期准妈妈、哺乳期妈妈、3岁以上儿童",
        avoid="对藻类过敏者",
        special="孕妇和哺乳期是主要适用人群；3岁以下婴幼儿需在医生指导下使用；老人一般选成人鱼油即可",
        med="正在服用抗凝药物或有出血倾向的孕妇，请先咨询产科医生",
        storage="避光密封，置于阴凉处，夏天可冷藏",
        shelf="24个月", opened="开封后建议2个月内吃完",
        spoil="胶囊破裂或有油哈味",
    ),
    dict(
        key="liver", name="奶蓟草护肝片", aliases=["护肝片", "奶蓟草"],
        typos=["奶鸡草护肝片", "护干片", "奶季草"],
        spec="0.5g×60片/瓶",
        ingr="每片含奶蓟草提取物300mg（水飞蓟素含量80%），搭配葛根提取物和姜黄",
        effect="对化学性肝损伤有辅助保护作用，适合经常饮酒应酬的人",
        excip="微晶纤维素、二氧化硅、硬脂酸镁",
        dose="成人每日2次，每次1片",
        timing="饭后吃；如需饮酒，可在饮酒前1小时吃1片",
        tip="护肝片不能解酒，不能因此多喝酒",
        course="1到3个月",
        suit="经常饮酒应酬、长期熬夜、体检转氨酶偏高的成年人",
        avoid="对菊科植物过敏者",
        special="孕妇和哺乳期禁用；儿童不宜；老人可减为每日1片",
        med="正在服用慢性病药物或肝病确诊者，请在医生指导下使用",
        storage="密封，置于阴凉干燥处",
        shelf="24个月", opened="开封后建议4个月内吃完",
        spoil="片剂变色或出现霉点",
    ),
    dict(
        key="fiber", name="膳食纤维粉", aliases=["膳食纤维", "纤维粉"],
        typos=["善食纤维粉", "膳食先维", "膳食纤维份"],
        spec="10g×20袋/盒，西梅味",
        ingr="每袋含膳食纤维6g，来自菊粉、抗性糊精和燕麦纤维，添加西梅粉",
        effect="促进肠道蠕动，有助于改善便秘，增加饱腹感",
        excip="西梅粉、柠檬酸、甜菊糖苷",
        dose="每日1至2袋，用300毫升温水冲开后饮用",
        timing="早晨空腹或饭前半小时喝，需要同时多喝水",
        tip="刚开始可能有轻微腹胀，属正常现象",
        course="2到4周",
        suit="便秘人群、控制体重的人、饮食精细蔬菜少的人",
        avoid="肠梗阻患者、严重腹泻者",
        special="孕妇可以吃，每日1袋；哺乳期可以；3岁以上儿童每日半袋；老人每日1袋",
        med="正在服用药物者，纤维粉与药物间隔2小时，以免影响吸收",
        storage="常温密封保存，避免潮湿",
        shelf="24个月", opened="单袋开封后当次冲完",
        spoil="粉末结块变硬",
    ),
]

# Aspect frames for product docs.  The vocabulary of each frame is specific to
# its aspect (e.g. only the 人群 frame says 孕妇/哺乳期/儿童/老人/服药).
FD_ASPECTS = [
    ("eff", "功效与成分", "功效成分",
     "{name}（{brand}出品，规格{spec}）的主要成分：{ingr}。功效作用：{effect}。配料表：{excip}。"
     "本品属保健食品，不能代替正常饮食和治疗，实际效果因人而异。"
     "相关问题：有什么功效作用、有啥用、管不管用、是干嘛的、主要成分和含量、配料表。"),
    ("use", "用法用量", "用法用量",
     "{name}用法用量：{dose}。服用时间：{timing}。小贴士：{tip}。"
     "建议连续吃{course}，每天的用量不要自行加倍，漏吃一次无需补吃。"
     "吃{a0}期间如出现胃部不适，可以改为随餐吃或减半，仍不缓解请停用。"
     "相关问题：怎么吃、咋吃、一天吃几次、一次吃多少、什么时间吃、饭前还是饭后、连续吃多久、漏吃怎么办。"),
    ("crowd", "适用与禁忌人群", "适用人群",
     "{name}适宜人群：{suit}。不适宜人群及禁忌：{avoid}。"
     "孕妇、哺乳期、儿童和老人：{special}。慢性病及服药者：{med}。"
     "相关问题：孕妇怀孕能吃吗、哺乳期喂奶能吃吗、小孩能吃吗、老人爸妈能吃吗、吃药能一起吃吗、什么人不适合、禁忌。"),
    ("store", "储存方法与保质期", "储存方法",
     "{name}储存方法：{storage}。保质期{shelf}，{opened}。"
     "如发现{spoil}，说明可能已变质或过期，请停止食用并联系客服更换。"
     "{a0}请勿存放在浴室、灶台旁等潮湿高温处，也不要放在车里暴晒。"
     "相关问题：怎么保存存放、放哪儿、要不要放冰箱、保质期多久、开封后放多久、过期还能吃吗、夏天会坏吗。"),
]

FD_GENERAL = [
    ("refund", "退换货与售后政策",
     "五医生官方商城支持7天无理由退换货，商品未拆封、包装完好即可申请退货退款。"
     "已拆封的保健食品出于卫生安全原因不支持无理由退货，但如存在质量问题、破损或发错货，"
     "拍照联系客服后可免费换货或退款，退款原路返回，一般3至5个工作日到账。",
     ["能不能退钱", "拆封后能退货吗", "买错了怎么退", "退换货政策", "收到破损怎么办"]),
    ("ship", "物流配送与发货时间",
     "五医生商城订单在下单后48小时内发货，默认使用顺丰或京东快递，江浙沪一般次日送达，"
     "其他地区2至4天。全国满99元包邮，新疆、西藏等偏远地区满199元包邮。"
     "物流信息可在“我的订单”中查看，如超过7天未更新请联系客服催件。收货时请当面检查外包装，快递破损可拒收。",
     ["几天发货", "用什么快递", "偏远地区包邮吗", "物流不动怎么办"]),
    ("member", "会员等级与积分规则",
     "注册五医生会员即享银卡权益，累计消费满1000元升级金卡，满3000元升级黑卡。"
     "每消费1元得1积分，100积分可抵扣1元，积分有效期为12个月。金卡会员享9.5折，"
     "黑卡会员享9折并可每月领取一张无门槛优惠券，生日当月积分双倍。积分可在“会员中心”查看明细，退货时对应积分会扣回。",
     ["会员积分怎么用", "积分抵现", "怎么升级金卡", "黑卡权益"]),
    ("authentic", "正品防伪查询",
     "五医生所有产品瓶身或盒底贴有防伪标签，刮开涂层后可扫描二维码或登录官网输入16位防伪码查询真伪。"
     "首次查询会显示“正品”，如提示已被多次查询，请警惕假货并联系客服。"
     "请通过官方旗舰店和授权渠道购买，非授权渠道购买的商品无法享受售后保障。",
     ["怎么查正品", "防伪码在哪里", "辨别真假货"]),
    ("invoice", "发票开具说明",
     "五医生官方商城支持开具电子普通发票和增值税专用发票。下单时在结算页填写抬头和税号即可，"
     "电子发票会在确认收货后24小时内发送至预留邮箱；如下单时忘记开票，可在订单完成后"
     "90天内在“我的订单—申请开票”补开。专用发票需上传营业执照等资质。",
     ["能开发票吗", "电子发票怎么开", "忘了开票补开"]),
    ("promo", "优惠活动与优惠券",
     "五医生商城常规活动包括：新人首单立减20元；每月8日会员日全场满300减50；"
     "618和双11大促期间部分产品买二送一。优惠券可在“领券中心”领取，"
     "每笔订单限用一张，优惠券与会员折扣可叠加，但与买赠活动不叠加。活动价以结算页为准，活动结束后不补差价。",
     ["最近优惠活动", "满减怎么算", "领优惠券", "会员日打几折"]),
    ("combo", "多款产品搭配服用建议",
     "同时吃多种营养补充剂时，建议错开时间：脂溶性的软胶囊随午餐或晚餐吃；"
     "矿物质类与益生菌、纤维类产品至少间隔1至2小时；同类营养素不要叠加超量。"
     "如果一天要吃三种以上，可以联系营养顾问免费定制搭配方案，避免重复补充。",
     ["几种营养品一起吃", "同时吃几种保健品注意什么", "搭配会不会冲突"]),
    ("service", "客服与营养顾问咨询",
     "五医生在线客服工作时间为每天9:00至22:00，可在商城App或小程序点击“联系客服”，"
     "输入“人工”转接人工客服。营养顾问团队提供一对一免费咨询，服务热线400-820-5005，"
     "节假日照常服务，夜间留言次日上午回复。咨询时请提供订单号，便于客服快速查询处理。",
     ["客服几点上班", "找人工客服", "营养顾问咨询"]),
]

# Query templates (fivedoctors).  {p} = product surface form.
FD_Q = {
    "eff": {
        "spec": ["{p}有什么功效", "{p}的主要成分是什么", "{p}每粒含量是多少", "{p}有什么作用",
                 "{p}的配料表有哪些", "请问{p}的功效和成分"],
        "colloq": ["{p}吃了到底有啥用啊", "{p}里面都有啥成分", "{p}管用不", "{p}是干嘛的啊",
                   "{p}有啥功效没"],
        "under": ["它主要有啥功效", "这个成分都有啥", "那它有什么作用啊", "这款里面含量多少",
                  "那配料表是啥", "这个到底管不管用"],
    },
    "use": {
        "spec": ["{p}怎么吃", "{p}一天吃多少", "{p}饭前吃还是饭后吃", "{p}的用法用量",
                 "{p}什么时间服用最好", "{p}要连续吃多久"],
        "colloq": ["{p}咋吃啊", "{p}啥时候吃效果好", "{p}一次吃多少合适", "{p}漏吃了一顿咋办"],
        "under": ["那一天吃几次", "这个咋吃啊", "饭前吃还是饭后吃", "用量是多少",
                  "一次吃多少合适", "要连续吃多久才行", "那啥时候吃比较好"],
    },
    "crowd": {
        "spec": ["{p}孕妇能吃吗", "{p}小孩可以吃吗", "{p}哺乳期能吃吗", "老人能吃{p}吗",
                 "在吃降压药能吃{p}吗", "{p}适合什么人群", "{p}有什么禁忌"],
        "colloq": ["我怀孕了能不能吃{p}", "{p}给娃吃行不行", "{p}俺爸妈能吃不",
                   "喂奶期间吃{p}有事没"],
        "under": ["那它孕妇能吃吗", "小孩能不能吃这个", "哺乳期可以吃吗", "我在吃药能一起吃吗",
                  "老人吃这个行不行", "有啥禁忌没", "什么人不适合吃", "我怀孕了还能接着吃吗"],
    },
    "store": {
        "spec": ["{p}怎么保存", "{p}保质期多久", "{p}开封后能放多久", "{p}要不要放冰箱",
                 "{p}的储存方法"],
        "colloq": ["{p}过期了还能吃不", "{p}放哪儿存着好", "{p}夏天会不会坏"],
        "under": ["那保质期多久", "开封了能放多久啊", "这个要放冰箱吗", "夏天怎么存放",
                  "它保存有啥讲究"],
    },
}

FD_GENERAL_Q = {
    "refund": ["能不能退钱啊", "拆封了还能退货吗", "退换货政策是什么", "买错了怎么退",
               "收到的瓶子破了怎么办"],
    "ship": ["下单后几天能发货", "用的什么快递", "偏远地区包邮吗", "物流好几天没动了咋办"],
    "member": ["会员积分怎么用", "积分能抵现吗", "怎么升级金卡会员", "黑卡有啥权益"],
    "authentic": ["怎么查是不是正品", "防伪码在哪里", "怎么辨别真假货"],
    "invoice": ["能开发票吗", "电子发票怎么开", "忘了开票还能补开吗"],
    "promo": ["最近有什么优惠活动", "满减怎么算", "有没有优惠券领", "会员日打几折"],
    "combo": ["好几种营养品能一起吃吗", "同时吃几种保健品要注意啥", "搭配着吃会不会冲突"],
    "service": ["客服几点上班", "怎么找人工客服", "有没有营养顾问可以咨询"],
}

FD_PROFILES = [
    "女, 29岁, 怀孕5个月, 关注孕期营养", "男, 45岁, 程序员, 经常熬夜加班",
    "女, 35岁, 二胎妈妈, 大宝6岁", "男, 62岁, 退休教师, 有高血压在服药",
    "女, 24岁, 研究生, 关注皮肤状态", "男, 31岁, 健身爱好者, 每周练4次",
    "女, 52岁, 更年期, 睡眠不好", "女, 27岁, 备孕中", "男, 38岁, 销售, 应酬多常喝酒",
    "女, 30岁, 哺乳期, 宝宝4个月", "男, 70岁, 膝关节不好, 爱爬山",
    "女, 41岁, 金卡会员, 经常回购", "女, 33岁, 上班族, 每天看电脑10小时",
    "男, 28岁, 经常出差倒时差", "女, 46岁, 关注心血管健康", "男, 55岁, 血脂偏高",
    "女, 36岁, 孩子5岁挑食", "男, 22岁, 大学生, 肠胃不太好",
]

# ---------------------------------------------------------------------------
# chengla: 橙啦教育 courses
# ---------------------------------------------------------------------------
CL_BRAND = "橙啦教育"

CL_COURSES = [
    dict(
        key="kyeng", name="考研英语全程班", aliases=["考研英语", "考研英语一", "英语一"],
        typos=["考研英与", "考验英语", "烤研英语"],
        modules="基础词汇与长难句、阅读理解精讲、完形与新题型、翻译、大小作文五大模块，覆盖英语一和英语二",
        materials="纸质版《考研英语核心词汇》《阅读真题精析》两本，另有近20年真题电子版",
        price="全程班标价3980元，含基础、强化、冲刺三个阶段",
        discount="3月31日前报名享早鸟价3280元，两人拼团每人再减200元，往届学员续报8折",
        installment="支持花呗12期免息分期",
        format="直播为主，每节课都有录播回放，可在App倍速观看",
        schedule="每周二、周四晚上19:30至21:30直播，周六上午安排答疑",
        period="9个月，从3月开课到12月考前",
        teachers="主讲陈思远老师，英语语言文学硕士，教授考研英语12年，作文批改团队由8位专职老师组成",
        suit="2025、2026届考研学生，以及需要考英语一或英语二的在职考生",
        req="建议四级已过；零基础或词汇量低于3000的同学需先学基础词汇预备课",
        refund="开课7天内且观看课时不超过3节可全额退费；开课7天后按未上课时比例退费，已寄出的教材扣除200元",
    ),
    dict(
        key="kymath", name="考研数学全程班", aliases=["考研数学", "考研数学一", "数学一"],
        typos=["考研数雪", "考验数学", "考研书学"],
        modules="高等数学、线性代数、概率论与数理统计三科，分基础、强化、真题、冲刺四轮，区分数一数二数三",
        materials="纸质版《高数基础讲义》《线代通关手册》《概率论300题》，另附历年真题逐题视频解析",
        price="全程班标价4580元",
        discount="早鸟价3880元，考研英语和数学联报立减600元，本校学生凭学生证减100元",
        installment="支持分期付款，最多12期",
        format="直播加录播，直播课可回放，习题课为录播",
        schedule="每周一、三、五晚上19:00至21:30直播，周日下午做题讲评",
        period="10个月，3月至12月",
        teachers="主讲林致远老师，数学系博士，讲授高数15年；线代和概率由周敏老师主讲",
        suit="需考数学一、数学二、数学三的考研学生，理工科和经管类专业均适合",
        req="建议学过大学高等数学；跨专业零基础同学可先补零基础预备课",
        refund="开课7天内未超过3节课可全额退费；之后按剩余课时比例退，联报课程需整体退",
    ),
    dict(
        key="kypol", name="考研政治冲刺班", aliases=["考研政治", "政治冲刺班"],
        typos=["考研正治", "考验政治", "考研政制"],
        modules="马原、毛中特、史纲、思修法基四部分知识点串讲，时政专题，选择题技巧和分析题答题模板",
        materials="纸质版《政治核心考点速记》《冲刺8套卷》和时政小册子，考前押题4套卷电子版",
        price="冲刺班标价1280元",
        discount="9月前报名980元，报考研英语或数学全程班的学员加报政治只需680元",
        installment="支持花呗3期免息",
        format="全部录播加每周一次直播答疑，冲刺阶段增加直播押题课",
        schedule="录播课随时看，直播答疑每周六晚上20:00",
        period="约3个月，9月至12月",
        teachers="主讲刘卫东老师，马克思主义理论博士，考研政治教学10年",
        suit="9月后开始复习政治的考研学生、时间紧张的在职考生",
        req="无需政治基础，文理科都可以学",
        refund="开课前可全额退费；开课后观看不超过20%可退70%，超过20%不予退费",
    ),
    dict(
        key="xingce", name="公务员行测系统班", aliases=["行测", "公考行测", "行测系统班"],
        typos=["行侧", "形测", "公考刑测"],
        modules="言语理解、数量关系、判断推理、资料分析、常识判断五大模块，每模块配专项刷题",
        materials="纸质版《行测五大模块精讲》《资料分析速算手册》，题库App含2万道真题",
        price="行测系统班标价2680元",
        discount="国考季报名立减300元，行测和申论联报3980元，三人团每人再减100元",
        installment="支持6期免息分期",
        format="直播加录播，每晚直播课后有专项练习和次日讲评",
        schedule="每周一至周五晚上19:30至21:00直播",
        period="3个月",
        teachers="主讲张立群老师，从事公考培训9年；资料分析由前统计局工作人员赵晨老师主讲",
        suit="准备国考、省考、事业单位考试的应届生和在职人员",
        req="零基础可以学，建议本科及以上学历，大专可报部分岗位",
        refund="开课7天内可全额退费；笔试未过可申请协议退费，退还学费的50%",
    ),
    dict(
        key="shenlun", name="申论写作精品班", aliases=["申论", "申论写作", "申论班"],
        typos=["申轮", "深论", "申论写做"],
        modules="归纳概括、综合分析、提出对策、贯彻执行、大作文五类题型，含热点专题和范文精讲",
        materials="纸质版《申论高分范文100篇》《规范词积累手册》，每周热点素材电子版",
        price="申论精品班标价2280元",
        discount="与行测联报3980元，老学员续报立减400元",
        installment="支持6期免息分期，也可以先付定金500元锁定小班名额",
        format="直播小班，每班不超过40人，课后作文一对一人工批改",
        schedule="每周六、周日上午9:00至11:30直播",
        period="2个半月",
        teachers="主讲王雅琴老师，中文系硕士，曾任政府机关文字秘书，申论教学8年",
        suit="准备国考、省考申论科目的考生，尤其是写作得分偏低的同学",
        req="无基础要求，需要每周完成2篇作文练习",
        refund="开课前全额退费；开课后两次课以内退80%，之后不予退费",
    ),
    dict(
        key="mianshi", name="公务员面试特训营", aliases=["公考面试", "结构化面试", "面试班"],
        typos=["公考面是", "面式班", "结构话面试"],
        modules="结构化面试六大题型、无领导小组讨论、答题思路和礼仪仪态，含多轮全真模拟",
        materials="《面试真题精解》讲义和模拟评分表，课后提供录像复盘",
        price="特训营7天封闭班标价6800元，线上班2980元",
        discount="笔试进面的学员凭进面名单减500元，同岗位两人同报各减300元",
        installment="封闭班支持分期",
        format="线下封闭集训为主，在北京、成都、武汉设有教学点，也可选线上直播小组模拟",
        schedule="笔试成绩公布后滚动开班，封闭班全天8:30至21:00",
        period="7天封闭班或15天线上班",
        teachers="由前面试考官李建国老师领衔，团队12人均有5年以上面试辅导经验",
        suit="已经进入面试的国考、省考、事业单位考生",
        req="需提供笔试进面证明",
        refund="面试未通过可退还学费的60%（协议班）；开班前3天以上退出可全额退费",
    ),
    dict(
        key="jiaozi", name="教师资格证笔试班", aliases=["教师资格证", "教资笔试", "教资"],
        typos=["教师资格症", "教资笔式", "教师姿格证"],
        modules="科目一综合素质、科目二教育知识与能力、科目三学科知识，覆盖幼儿园、小学、中学三个学段",
        materials="纸质版三科讲义和《教资高频考点》，题库含历年真题和5套模拟卷",
        price="笔试三科全科班标价1680元，单科班680元",
        discount="全科班限时1380元，笔试加面试联报2580元，师范在校生减100元",
        installment="支持花呗分期",
        format="录播为主，每周2次直播串讲和答疑",
        schedule="录播随时学，直播为周三、周日晚上20:00",
        period="2到3个月，对应上半年3月或下半年10月考试",
        teachers="主讲孙丽老师，教育学硕士，中学一线教师出身，教资辅导7年",
        suit="想当老师的师范生、非师范生和在职转行人员",
        req="大专及以上学历（或在读大三大四），非师范专业也可以报考",
        refund="开课7天内可全额退费；笔试未通过可免费重读下一期",
    ),
    dict(
        key="ielts", name="雅思7分冲刺班", aliases=["雅思", "IELTS", "雅思班"],
        typos=["鸭思", "雅丝", "牙思"],
        modules="听力、阅读、写作、口语四科，写作Task1和Task2专项批改，口语题库每季度更新",
        materials="剑桥雅思真题集和《雅思写作高分句型》，另有机考模拟系统",
        price="7分冲刺班标价8800元，6.5分班6800元",
        discount="暑期班报名减800元，出国留学申请合作用户再减500元",
        installment="支持12期分期",
        format="直播小班课，每班不超过12人，口语为一对一外教",
        schedule="工作日晚上19:00至21:00，周末全天可选",
        period="8到12周",
        teachers="中方老师均有雅思8分以上成绩，外教来自英国和澳大利亚，持CELTA证书",
        suit="准备出国留学、移民的学生和在职人员，目标分数6.5到7分",
        req="建议入学时英语水平相当于六级或雅思5.5分，入学前需参加免费分级测试",
        refund="开课前全额退费；开课后未超过1/4课时退70%；学完后考试未达目标分可免费重读一期",
    ),
    dict(
        key="cet", name="大学英语四六级通关班", aliases=["四六级", "英语四级", "英语六级"],
        typos=["四六急", "四六极", "似六级"],
        modules="听力、阅读、翻译、写作四部分，含核心词汇闪记和真题精讲",
        materials="《四六级核心词汇》和近10年真题电子版，App每日打卡背单词",
        price="四级或六级单科299元，四六级联报499元",
        discount="开学季两人拼团每人199元，上次未过的学员续报免费",
        installment="无需分期",
        format="全部录播，另有每周一次直播答疑和模考",
        schedule="录播课随时看，考前一个月每晚直播带练",
        period="约2个月，对应6月和12月考试",
        teachers="主讲何晓雨老师，英语专业八级，四六级辅导6年",
        suit="在校大学生，尤其是四级多次未过或想冲刺六级高分的同学",
        req="高中英语基础即可，零基础可先学词汇课",
        refund="购买7天内且学习不超过2节可退款；考试未过可免费重学",
    ),
    dict(
        key="coding", name="少儿编程Python启蒙课", aliases=["少儿编程", "儿童编程", "Python启蒙课"],
        typos=["少儿编城", "少儿变成", "少而编程"],
        modules="Scratch图形化编程入门、Python基础语法、小游戏制作和算法思维四个阶段，共96课时",
        materials="寄送编程学习卡片和练习册，学生可在橙啦编程平台保存作品",
        price="一年期课程标价5980元，按课时约62元一节",
        discount="免费试听1节，寒暑假报名送12课时，兄弟姐妹同报第二人半价",
        installment="支持按学期分两次付款",
        format="直播小班课，每班4到6个孩子，老师实时看屏幕指导",
        schedule="周末上午或下午、工作日晚上18:30均有班次，每节课45分钟",
        period="1年，每周1节，共48周",
        teachers="老师均为计算机相关专业毕业，经过儿童教育培训，平均教龄3年",
        suit="7到12岁的小学生，对电脑和游戏感兴趣的孩子",
        req="孩子会认字、会用鼠标即可，家长无需会编程",
        refund="任何时候可申请退费，按剩余课时退还，赠送课时不退，已开课超过一半扣除10%手续费",
    ),
    dict(
        key="aoshu", name="小学奥数思维课", aliases=["小学奥数", "奥数", "数学思维课"],
        typos=["小学澳数", "奥树", "小学傲数"],
        modules="计算技巧、数论、几何、应用题、计数与逻辑推理，按一到六年级分级教学",
        materials="每学期寄送彩色教材和练习册，配套错题本和每周挑战题",
        price="每学期16讲标价2880元",
        discount="续报下学期9折，推荐同学报名双方各得200元学费券",
        installment="按学期付费",
        format="直播互动课，每班不超过20人，课后有录播回放",
        schedule="每周六或周日一次，每次90分钟，暑期有集训班",
        period="每学期16周",
        teachers="主讲老师多为数学专业毕业，平均教龄6年，部分老师带过竞赛获奖学生",
        suit="一到六年级小学生，想培养数学思维或准备竞赛的孩子",
        req="入学前做一次免费入学测评分班，基础薄弱可先上培优班",
        refund="开课后3讲内可全额退费，之后按剩余讲次退费",
    ),
    dict(
        key="kuaiji", name="初级会计职称班", aliases=["初级会计", "初会", "初级会计证"],
        typos=["初级会记", "出级会计", "初级会几"],
        modules="《初级会计实务》和《经济法基础》两科，分基础、习题、冲刺三阶段",
        materials="纸质版两科讲义和《初级会计万题库》，机考模拟系统",
        price="两科全程班标价1980元",
        discount="年底报名享1580元，考试未过的学员免费重读",
        installment="支持花呗6期免息",
        format="录播为主，每周3次直播串讲",
        schedule="直播为周一、三、五晚上20:00至21:30",
        period="4到5个月，对应每年5月考试",
        teachers="主讲杨帆老师，注册会计师，会计培训经验11年",
        suit="想从事财务工作的大学生、转行人员和财务助理",
        req="无学历和专业要求，高中以上学历可报考，零基础可学",
        refund="开课7天内可全额退费；考试未通过可申请协议退费，退还学费的50%",
    ),
]

CL_ASPECTS = [
    ("outline", "课程内容与教材", "课程内容",
     "{name}课程内容：{modules}。配套教材资料：{materials}。课程大纲在报名页可下载，"
     "{a0}的课程内容和讲义每年会根据最新要求与学员反馈更新。"
     "相关问题：讲哪些内容、学什么、讲啥、课程大纲、有没有纸质教材、发不发书、送哪些资料、资料多不多。"),
    ("price", "价格与优惠", "价格",
     "{name}价格：{price}。优惠活动：{discount}。付款方式：{installment}。"
     "{a0}学费包含全部课程、讲义和答疑服务，报名后不再另外收费，价格以报名页为准。"
     "相关问题：多少钱、学费多少、贵不贵、有什么优惠折扣、能便宜点吗、拼团怎么算、能不能分期付款。"),
    ("time", "上课时间与形式", "上课时间",
     "{name}上课形式：{format}。上课时间：{schedule}。学习周期：{period}。"
     "如有时间冲突，直播课可以看回放补课，{a0}的课程在有效期内可无限次回看，开课前App会推送上课提醒。"
     "相关问题：什么时候上课、几点上课、一周上几次课、直播还是录播、错过直播有回放吗、要学多久、上班族晚上能跟上吗。"),
    ("refund", "退费政策", "退费政策",
     "{name}退费政策：{refund}。退费需在App“我的订单”中提交申请，审核通过后7个工作日内原路退款。"
     "{a0}赠送的资料和已使用的优惠券不予退还，退费金额以实际支付金额为准。"
     "相关问题：能退费吗、能不能退钱、退款怎么算、不想学了退多少、学了几节课还能退吗、没考过能退吗。"),
    ("teacher", "师资介绍", "老师情况",
     "{name}师资：{teachers}。所有授课老师均经过{brand}试讲考核，学员可在课程页查看老师介绍和试听片段，"
     "{a0}每期结课后会根据学员评价对老师进行评分。"
     "相关问题：老师是谁、谁来讲课、哪个老师讲、师资怎么样、老师靠谱吗、讲得好不好、老师什么来头、多少年经验。"),
    ("crowd", "适合人群与基础要求", "适合人群",
     "{name}适合人群：{suit}。基础要求：{req}。不确定自己适不适合{a0}的同学，"
     "可以先免费试听或找课程顾问做一次水平评估，报名后也可在开课前免费调整班型。"
     "相关问题：适合什么人报、适不适合我、零基础小白能学吗、基础差能学会吗、对基础有什么要求、在职能报吗。"),
]

CL_GENERAL = [
    ("app", "听课App与设备要求",
     "橙啦教育所有课程通过橙啦App或电脑客户端听课，支持手机、平板和电脑，同一账号最多可在3台设备登录。"
     "直播课需要稳定网络，建议带宽4M以上；录播课可以提前缓存到本地离线观看，支持0.75到2倍速播放。App在各大应用商店搜索“橙啦”即可下载。",
     ["用什么软件听课", "平板能看课吗", "缓存离线看", "账号能登几台设备"]),
    ("invoice", "发票开具说明",
     "橙啦教育可开具增值税电子普通发票，发票内容为“培训费”。在App“我的—订单—申请开票”填写抬头和税号，"
     "3个工作日内发送到邮箱。单位报销需要专用发票的，请联系课程顾问提供营业执照信息。每个订单只能开一次发票，退费后发票作废。",
     ["能开发票吗", "单位报销发票", "发票抬头在哪填"]),
    ("transfer", "转班与延期规则",
     "报名后如需换成其他课程，可在开课30天内申请转班一次，补齐差价即可，差价为负时退回余额。"
     "因工作、生病等原因无法按期学习的，可以申请休学延期，最长延期6个月，期间课程有效期相应顺延。转班和延期都在App里提交，班主任审核。",
     ["报错课能换课吗", "转班补差价", "工作忙能延期吗", "生病能休学吗"]),
    ("support", "班主任与答疑服务",
     "每位学员报名后会被拉入班级群并分配专属班主任，负责督学、提醒上课和收集问题。"
     "学科答疑老师每天9:00至22:00在线，在App提问后一般2小时内回复，作业批改在48小时内完成。班主任每周会发学习报告，提醒落下的课程。",
     ["有班主任吗", "有问题找谁答疑", "作业多久批改", "有人督学吗"]),
]

CL_Q = {
    "outline": {
        "spec": ["{p}都讲哪些内容", "{p}的课程大纲是什么", "{p}有没有纸质教材", "{p}送哪些资料",
                 "{p}学些什么"],
        "colloq": ["{p}到底讲啥啊", "{p}给不给发书", "{p}资料多不多"],
        "under": ["那都讲哪些内容", "有教材吗", "这个课学什么", "资料会寄过来吗", "课程大纲能发我看看吗"],
    },
    "price": {
        "spec": ["{p}多少钱", "{p}的价格是多少", "{p}有什么优惠", "{p}能分期付款吗", "{p}学费多少"],
        "colloq": ["{p}贵不贵啊", "{p}能便宜点不", "{p}有没有折扣啊", "{p}拼团咋算"],
        "under": ["那多少钱啊", "贵不贵", "有没有优惠", "能分期吗", "学费能便宜点吗", "现在报有折扣不"],
    },
    "time": {
        "spec": ["{p}什么时候上课", "{p}是直播还是录播", "{p}有回放吗", "{p}要学多久",
                 "{p}几点上课"],
        "colloq": ["{p}上班族晚上能跟上不", "{p}错过直播咋办", "{p}一周上几次课啊"],
        "under": ["那什么时候上课", "是直播还是录播", "错过了能看回放吗", "要学多久", "一周上几次",
                  "上课时间是几点"],
    },
    "refund": {
        "spec": ["{p}能退费吗", "{p}的退费政策", "{p}退款怎么算", "报了{p}不想学了能退吗"],
        "colloq": ["{p}能不能退钱啊", "{p}学一半不想学了退多少", "{p}没考过退钱不"],
        "under": ["能退费吗", "不想学了能退钱吗", "退款怎么算", "学了几节课还能退吗", "没考过能退吗"],
    },
    "teacher": {
        "spec": ["{p}的老师是谁", "{p}师资怎么样", "{p}主讲老师有什么经验", "{p}是哪个老师讲"],
        "colloq": ["{p}老师靠谱不", "{p}老师讲得好不好", "{p}老师啥来头"],
        "under": ["老师是谁啊", "师资怎么样", "主讲老师靠谱吗", "谁来讲课", "老师有多少年经验"],
    },
    "crowd": {
        "spec": ["{p}适合什么人", "零基础能学{p}吗", "{p}对基础有什么要求", "在职能报{p}吗"],
        "colloq": ["我基础很差能学会{p}吗", "{p}适不适合我", "{p}小白能学不"],
        "under": ["零基础能学吗", "我这种情况适合吗", "对基础有要求吗", "在职的能报吗", "适合什么人报"],
    },
}

CL_GENERAL_Q = {
    "app": ["用什么软件听课", "能在平板上看课吗", "课程能缓存下来离线看吗", "一个账号能登几台设备"],
    "invoice": ["能开发票吗", "单位报销要发票怎么开", "发票抬头在哪填"],
    "transfer": ["报错课了能换课吗", "转班要补差价吗", "工作太忙能延期吗", "生病了能休学吗"],
    "support": ["有班主任吗", "有问题找谁答疑", "作业多久批改", "有人督学吗"],
}

CL_PROFILES = [
    "女, 22岁, 大三, 准备考研", "男, 26岁, 在职程序员, 想考公", "女, 30岁, 宝妈, 孩子8岁",
    "男, 38岁, 孩子10岁, 四年级", "女, 20岁, 大二, 四级没过", "男, 24岁, 应届生, 想出国读研",
    "女, 28岁, 想转行当老师", "女, 25岁, 财务助理", "男, 27岁, 二战考研", "女, 23岁, 英语专业",
    "男, 32岁, 国企员工, 时间紧", "女, 35岁, 孩子7岁, 一年级", "男, 21岁, 大三, 理工科",
    "女, 29岁, 已进面试", "男, 40岁, 孩子9岁, 喜欢玩游戏", "女, 26岁, 跨专业考研",
]

# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------
CJK = re.compile(r"[\u4e00-\u9fff]")


def cjk_len(s: str) -> int:
    return len(CJK.findall(s))


def build_kb(prefix, brand, items, aspects, general):
    """Return docs plus a lookup {(item_key, aspect_key): doc} and general docs."""
    docs, index = [], {}
    n = 0
    for it in items:
        for akey, atitle, _label, frame in aspects:
            n += 1
            doc = {
                "doc_id": f"{prefix}-{n:03d}",
                "title": f"{it['name']}{atitle}",
                "content": frame.format(brand=brand, a0=it["aliases"][0], **it),
            }
            docs.append(doc)
            index[(it["key"], akey)] = doc
    for gkey, gtitle, content, kw in general:
        n += 1
        content = content + "相关问题：" + "、".join(kw) + "。"
        doc = {"doc_id": f"{prefix}-{n:03d}", "title": gtitle, "content": content}
        docs.append(doc)
        index[("_general", gkey)] = doc
    for d in docs:
        c = cjk_len(d["content"])
        assert 80 <= c <= 250, (d["doc_id"], c, d["content"])
    return docs, index


# Keep profiles plausible: a query about pregnancy gets a pregnant/trying profile,
# a kids' product gets a parent, etc.  (query keywords first, then item key).
PROFILE_HINTS_BY_QUERY = [
    (("怀孕", "孕妇"), ("怀孕", "备孕")),
    (("喂奶", "哺乳"), ("哺乳",)),
    (("小孩", "给娃"), ("孩子", "大宝")),
    (("爸妈", "老人"), ("退休", "膝关节", "血脂", "心血管")),
    (("降压药", "吃药"), ("高血压", "血脂")),
    (("上班族", "在职"), ("在职", "员工", "程序员", "助理")),
    (("零基础", "基础很差", "小白"), ("跨专业", "转行", "没过", "理工科", "助理")),
]
PROFILE_HINTS_BY_ITEM = {
    "folic": ("怀孕", "备孕"), "algae": ("怀孕", "哺乳"), "kidzinc": ("孩子", "大宝"),
    "glucosamine": ("膝关节", "退休"), "melatonin": ("睡眠", "倒时差", "熬夜"),
    "whey": ("健身",), "liver": ("喝酒",), "lutein": ("电脑", "熬夜"),
    "kyeng": ("考研",), "kymath": ("考研", "理工科"), "kypol": ("考研",),
    "xingce": ("考公", "国企"), "shenlun": ("考公", "国企"), "mianshi": ("面试",),
    "jiaozi": ("老师",), "ielts": ("出国",), "cet": ("四级", "大二"),
    "coding": ("游戏", "孩子"), "aoshu": ("孩子",), "kuaiji": ("财务",),
}


# Items whose users are children: parent profiles, and no exam / work-time wording.
KID_ITEMS = {"kidzinc", "coding", "aoshu"}
KID_UNFIT_WORDS = ("考过", "在职", "上班族")


def fits_item(template, item_key):
    return not (item_key in KID_ITEMS and any(w in template for w in KID_UNFIT_WORDS))


def hinted_pool(pool, query="", item_key=""):
    if item_key in KID_ITEMS:
        sub = [p for p in pool if any(h in p for h in PROFILE_HINTS_BY_ITEM[item_key])]
        if sub:
            return sub
    for keys, hints in PROFILE_HINTS_BY_QUERY:
        if any(k in query for k in keys):
            sub = [p for p in pool if any(h in p for h in hints)]
            if sub:
                return sub
    hints = PROFILE_HINTS_BY_ITEM.get(item_key, ())
    sub = [p for p in pool if any(h in p for h in hints)]
    return sub or pool


def pick_profile(rng, pool, p_empty, query="", item_key=""):
    if rng.random() < p_empty:
        return ""
    return rng.choice(hinted_pool(pool, query, item_key))


def history_for(rng, items, it, aspect_label, labels, allow_distractor=True):
    """History that names `it` last (optionally after a distractor product)."""
    other = rng.choice([x for x in items if x["key"] != it["key"]])
    mention = rng.choice([it["name"]] * 3 + it["aliases"][:1])
    olab = rng.choice(labels)
    forms = [
        f"用户此前询问了{mention}的{aspect_label}",
        f"用户刚下单了{mention}，问过{aspect_label}",
        f"用户在咨询{mention}，上一轮客服介绍了{aspect_label}",
    ]
    if allow_distractor:
        forms += [
            f"用户先问了{other['name']}的{olab}，后来又问了{mention}的{aspect_label}，当前在聊{mention}",
            f"用户对比了{other['name']}和{mention}，最后选了{mention}",
        ]
    return rng.choice(forms)


def make_queries(rng, items, aspects, general, general_q, qtemps, profiles,
                 profile_own_forms, history_general, index, n_total):
    labels = [a[2] for a in aspects]
    akeys = [a[0] for a in aspects]
    alabel = {a[0]: a[2] for a in aspects}
    # target mix
    n_general = round(n_total * 0.10)
    n_under = round(n_total * 0.40)
    n_spec = n_total - n_general - n_under
    n_typo = round(n_total * 0.21)

    # targets for product docs: cycle through all (item, aspect) pairs
    pairs = [(it, a) for it in items for a in akeys]
    targets = []
    while len(targets) < n_under + n_spec:
        block = pairs[:]
        rng.shuffle(block)
        targets.extend(block)
    targets = targets[: n_under + n_spec]
    kinds = ["under"] * n_under + ["typo"] * n_typo + ["spec"] * (n_spec - n_typo)
    rng.shuffle(kinds)

    rows = []
    for (it, akey), kind in zip(targets, kinds):
        qt = qtemps[akey]
        gold = index[(it["key"], akey)]["doc_id"]
        if kind == "under":
            q = rng.choice([t for t in qt["under"] if fits_item(t, it["key"])])
            mode = rng.choices(["history", "profile", "both"], weights=[6, 2, 2])[0]
            other_aspects = [a for a in akeys if a != akey]
            if mode in ("history", "both"):
                hist = history_for(rng, items, it, alabel[rng.choice(other_aspects)], labels)
            else:
                hist = rng.choice(["", "", history_general])
            if mode in ("profile", "both"):
                base = rng.choice(hinted_pool(profiles, q, it["key"]))
                prof = base + ", " + rng.choice(profile_own_forms).format(n=it["name"])
            else:
                prof = pick_profile(rng, profiles, 0.3, q, it["key"])
            rows.append(dict(query=q, profile=prof, history=hist, gold_doc_ids=[gold],
                             underspecified=True, _name=it["name"], _typo=False))
        else:
            if kind == "typo":
                surface = rng.choice(it["typos"])
            else:
                surface = rng.choice([it["name"], it["name"]] + it["aliases"])
            tmpl = rng.choice([t for t in qt["spec"] + qt["colloq"] if fits_item(t, it["key"])])
            q = tmpl.format(p=surface)
            prof = pick_profile(rng, profiles, 0.45, q, it["key"])
            hist = rng.choice(["", "", "", history_general])
            rows.append(dict(query=q, profile=prof, history=hist, gold_doc_ids=[gold],
                             underspecified=False, _name=it["name"], _typo=kind == "typo"))

    gkeys = [g[0] for g in general]
    for i in range(n_general):
        gkey = gkeys[i % len(gkeys)]
        q = rng.choice(general_q[gkey])
        rows.append(dict(query=q, profile=pick_profile(rng, profiles, 0.5),
                         history=rng.choice(["", "", history_general]),
                         gold_doc_ids=[index[("_general", gkey)]["doc_id"]],
                         underspecified=False, _name="", _typo=False))
    # avoid accidental template collisions: re-draw the profile of a repeated row
    seen = set()
    for r in rows:
        while (r["query"], r["profile"], r["history"]) in seen:
            r["profile"] = rng.choice(profiles)
        seen.add((r["query"], r["profile"], r["history"]))
    rng.shuffle(rows)
    # a few exact duplicates (same query/profile/history), realistic repeated asks
    for src in rng.sample(rows, N_DUPLICATES):
        rows.insert(rng.randrange(len(rows) + 1), dict(src))
    return rows


PUBLIC_KEYS = ("query", "profile", "history", "gold_doc_ids", "underspecified")


def write_jsonl(path: Path, rows, keys=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            obj = {k: r[k] for k in keys} if keys else r
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")


def build_tenant(tenant):
    if tenant == "fivedoctors":
        docs, index = build_kb("fd", FD_BRAND, FD_PRODUCTS, FD_ASPECTS, FD_GENERAL)
        rng = random.Random(f"{SEED}-fivedoctors")
        rows = make_queries(
            rng, FD_PRODUCTS, FD_ASPECTS, FD_GENERAL, FD_GENERAL_Q, FD_Q, FD_PROFILES,
            ["最近购买了{n}", "正在服用{n}", "购物车里有{n}", "上周收到了{n}"],
            "用户此前咨询过物流发货时间", index, N_QUERIES)
    else:
        docs, index = build_kb("cl", CL_BRAND, CL_COURSES, CL_ASPECTS, CL_GENERAL)
        rng = random.Random(f"{SEED}-chengla")
        rows = make_queries(
            rng, CL_COURSES, CL_ASPECTS, CL_GENERAL, CL_GENERAL_Q, CL_Q, CL_PROFILES,
            ["正在咨询{n}", "已报名{n}", "领取了{n}试听课", "收藏了{n}"],
            "用户此前问过App怎么下载", index, N_QUERIES)
    return docs, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out-root", type=Path, default=ROOT,
                    help="write data/kb and data/demo below this folder (default: the repository)")
    out = ap.parse_args().out_root
    for tenant in ("fivedoctors", "chengla"):
        docs, rows = build_tenant(tenant)
        write_jsonl(out / "data" / "kb" / f"{tenant}.jsonl", docs)
        write_jsonl(out / "data" / "demo" / f"{tenant}.queries.jsonl", rows, PUBLIC_KEYS)
        n_under = sum(r["underspecified"] for r in rows)
        n_typo = sum(r["_typo"] for r in rows)
        print(f"{tenant}: {len(docs)} docs, {len(rows)} queries, "
              f"underspecified {n_under / len(rows):.1%}, typo {n_typo / len(rows):.1%}")


if __name__ == "__main__":
    main()
