"""Small word lists behind the builtin provider's text analysis and extraction heuristics.

Deliberately short: they give cues, not answers. Every list is lowercase; lookups lowercase
their input. Multi-word gazetteer entries are matched against a whole phrase.
"""

from __future__ import annotations

__all__ = [
    "ABBREVIATIONS",
    "CLAIM_CUES",
    "CLAIM_CUES_ZH",
    "COMPASS",
    "CONNECTORS",
    "EVENT_WORDS",
    "FIRST_NAMES",
    "FUNCTION_WORDS",
    "GAZETTEER",
    "GENERIC_QUERY_WORDS",
    "GEO_PREFIXES",
    "GEO_PREPOSITIONS_STRONG",
    "GEO_PREPOSITIONS_WEAK",
    "GEO_SUFFIXES",
    "HOLIDAYS",
    "HONORIFICS",
    "KNOWN_ORGS",
    "MONTHS_DAYS",
    "NON_NAMES",
    "NOT_ALONE",
    "NOT_PERSONAL",
    "OF_HEADS",
    "ORG_NOUNS",
    "ORG_PREFIXES",
    "ORG_SUFFIXES",
    "ORG_SUFFIXES_ZH",
    "PARTICLES",
    "PERSON_DOTTED",
    "PLURAL_AUXILIARIES",
    "SENTENCE_STARTERS",
    "SINGULAR_AUXILIARIES",
    "SPEECH_VERBS",
    "SPREAD_WORDS",
    "STOPWORDS",
    "STOPWORDS_ZH",
    "VALUE_QUESTIONS",
    "ZH_NOT_NAMES",
    "words",
]


def words(text: str) -> frozenset[str]:
    return frozenset(text.lower().split())


def _phrases(text: str) -> frozenset[str]:
    return frozenset(p.strip().lower() for p in text.split(",") if p.strip())


# The one English stop-word list: never a search term (text.py) and never a name on its own
# (mentions.py). It also holds words of instructions ("tell", "describe", "list"), which a
# question is full of and which say nothing about what it asks.
STOPWORDS = words("""
a about above after again against all also am an and any are aren't as at be because been before
being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
don't down during each few for from further had hadn't has hasn't have haven't having he he'd
he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm i've if in into
is isn't it it's its itself let's me more most mustn't my myself no nor not of off on once only or
other ought our ours ourselves out over own same shan't she she'd she'll she's should shouldn't so
some such than that that's the their theirs them themselves then there there's these they they'd
they'll they're they've this those through to too under until up very was wasn't we we'd we'll
we're we've were weren't what what's when when's where where's which while who who's whom why
why's will with won't would wouldn't you you'd you'll you're you've your yours yourself
yourselves upon yet shall may might must ever every many much any anything something nothing
tell describe explain list give show please one two three four five six seven eight nine ten
eleven twelve also us
""")

# Capitalized only because they open a sentence (checked in addition to STOPWORDS).
SENTENCE_STARTERS = words("""
however therefore meanwhile moreover furthermore although though yesterday today tomorrow
tonight now still thus hence instead indeed perhaps maybe finally first second third next last
later earlier since unless whether after before during while once oh ah yes no well why yet
nevertheless otherwise besides unlike like according despite overall also again even just
here there where when what who how this these those that some many most several each every
all both either neither another other such only not never always often sometimes
nobody everyone everybody someone somebody anyone anybody
""")

MONTHS_DAYS = words("""
january february march april may june july august september october november december
jan feb mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday
saturday sunday
""")

# Abbreviations ending in "." that do not end a sentence.
ABBREVIATIONS = words("""
mr mrs ms mx dr prof st jr sr vs etc inc ltd co corp no nos fig figs approx dept est gen gov
rev capt col lt sgt hon mt ft ave blvd e.g i.e cf al vol pp
""")

# Honorifics and titles that mark a person; kept in the name only before a lone surname.
HONORIFICS = words("""
mr mrs ms mx miss dr prof professor sir dame lady lord madam madame mme mlle rev reverend capt
captain col colonel gen general lt sgt hon judge justice president senator governor minister
chancellor mayor king queen prince princess pope bishop father sister brother uncle aunt
""")

# Capitalized tokens that are not names on their own (split out of phrases).
NON_NAMES = words("""
phd ceo cfo cto coo cio vp svp evp md msc bsc ba ma mba ok tv id faq ps nb ad bc am pm usd eur
gbp cny rmb jpy kg km mm cm ml mg hr etc et pt est pst edt pdt cst gmt utc cet
""")

# Lowercase words that may sit inside one name ("Bank of England", "Anneke de Vries").
CONNECTORS = words("of the de la del della van der den von du da di dos das le al bin ibn &")
PARTICLES = words("de del della van von der den du da di dos das bin ibn al")
PERSON_DOTTED = words("mr mrs ms mx dr prof rev capt col gen lt sgt hon")
GEO_PREPOSITIONS_STRONG = words("in near across throughout around outside inside within")
GEO_PREPOSITIONS_WEAK = words("at from to into via toward towards")
SPEECH_VERBS = words("said says asked replied cried exclaimed answered told")
# Common nouns for a company: "the supplier Hengda", "Hengda, a mould maker".
ORG_NOUNS = words("""
company companies firm firms supplier suppliers maker makers manufacturer manufacturers vendor
startup start-up subsidiary retailer brand contractor carrier insurer lender publisher
""")
# Directions that make a known place a region of it ("Western Europe", "South Texas").
COMPASS = words("north south east west northern southern eastern western central")
# First words of two-word names that are places or organizations, not people.
NOT_PERSONAL = words("""
new old great north south east west central national international global digital world prime
royal federal public general united san santa los las el la le saint fort port
""")

# Capitalized words that are no entity on their own (still fine inside "Fashion Week").
NOT_ALONE = words("""
week weekend season quarter chapter section page figure table part volume episode round
black white american americans british english french german germans dutch chinese japanese
european europeans australian canadian israeli israelis palestinian palestinians russian
russians ukrainian indian italian spanish african asian mexican korean irish scottish welsh
swedish norwegian danish finnish polish greek turkish brazilian arab arabic muslim jewish
catholic christian hindu buddhist latin head chief director manager chair chairman chairwoman
officer lead leader engineer founder member partner editor analyst spokesperson spokesman
spokeswoman secretary treasurer
""")

ORG_SUFFIXES = words("""
ltd ltd. limited inc inc. incorporated corp corp. corporation co company companies gmbh ag ab
bv nv sa sas spa plc llc llp lp oy as kg kgaa pty pte university college school academy lab
labs laboratory laboratories bank group robotics systems institute foundation association agency
ministry department council committee commission authority board party union society club
hospital clinic partners holdings technologies technology tech industries logistics motors
energy electronics pharmaceuticals pharma press times news media airlines airways
bureau office services service solutions capital ventures fund trust network networks
semiconductor semiconductors software studios records publishing church parliament congress
senate court army navy police brigade federation alliance consortium cooperative
plastics manufacturing foods analytics dynamics microsystems
league united fc team
""")

ORG_PREFIXES = words("""
project programme program university bank ministry department institute college school
council committee bureau office house
""")

EVENT_WORDS = words("""
conference summit launch festival trial war recall audit expo forum meeting olympics games cup
championship election elections crisis revolution battle treaty accord symposium workshop
convention fair show week day eve strike scandal attack hurricane typhoon storm earthquake
pandemic outbreak ceremony awards tournament marathon incident disaster massacre rally protest
hearing inquiry review premiere exhibition celebration
""")

HOLIDAYS = words("""
christmas easter thanksgiving halloween ramadan diwali hanukkah passover eid new-year
""")

# Head words that may take "of" inside one name ("Bank of England", "Duke of Wellington").
OF_HEADS = words("""
bank university college school institute ministry department museum church cathedral board
council court house republic kingdom state states city province county duchy bay gulf sea isle
isles straits strait lake mount cape duke duchess king queen prince princess lord lady earl
battle war siege treaty festival feast day order society academy association
centre center union club chamber tower office bureau port federation commonwealth people
""")

GEO_SUFFIXES = words("""
city river street road avenue square lake mountain mountains island islands bay valley county
province district region town village kingdom republic hill hills lane strait peninsula canal
harbour harbor coast desert ocean sea gulf park bridge airport station forest plains heights
""")

GEO_PREFIXES = words("mount lake port fort cape isle gulf")

GAZETTEER = _phrases("""
afghanistan, albania, algeria, argentina, armenia, australia, austria, azerbaijan, bangladesh,
belarus, belgium, bolivia, bosnia, brazil, bulgaria, cambodia, cameroon, canada, chile, china,
colombia, croatia, cuba, cyprus, czechia, czech republic, denmark, ecuador, egypt, estonia,
ethiopia, finland, france, georgia, germany, ghana, greece, guatemala, haiti, honduras, hungary,
iceland, india, indonesia, iran, iraq, ireland, israel, italy, jamaica, japan, jordan,
kazakhstan, kenya, korea, south korea, north korea, kosovo, kuwait, laos, latvia, lebanon,
libya, lithuania, luxembourg, malaysia, mali, malta, mexico, moldova, mongolia, montenegro,
morocco, mozambique, myanmar, nepal, netherlands, the netherlands, holland, new zealand,
nicaragua, niger, nigeria, norway, oman, pakistan, panama, paraguay, peru, philippines, poland,
portugal, qatar, romania, russia, rwanda, saudi arabia, scotland, england, wales, senegal,
serbia, singapore, slovakia, slovenia, somalia, south africa, spain, sri lanka, sudan, sweden,
switzerland, syria, taiwan, tanzania, thailand, tunisia, turkey, uganda, ukraine, united states,
united states of america, united kingdom, great britain, britain, uruguay, uzbekistan,
venezuela, vietnam, yemen, zambia, zimbabwe, usa, us, u.s., u.s, uk, u.k., u.k, uae, eu,
europe, asia,
africa, north america, south america, latin america, antarctica, oceania, middle east,
scandinavia, benelux, emea, apac, latam, silicon valley, new york, new york city, nyc,
los angeles, san francisco, chicago, boston, seattle, washington, houston, dallas, austin,
miami, atlanta, denver, philadelphia, detroit, toronto, vancouver, montreal, london,
manchester, birmingham, liverpool, edinburgh, glasgow, dublin, paris, lyon, marseille, berlin,
hamburg, munich, frankfurt, stuttgart, cologne, dusseldorf, amsterdam, rotterdam, the hague,
utrecht, antwerp, brussels, ghent, luxembourg city, zurich, geneva, vienna,
prague, warsaw, budapest, copenhagen, stockholm, oslo, helsinki, madrid, barcelona, lisbon,
rome, milan, naples, turin, athens, istanbul, ankara, moscow, kyiv, kiev, cairo, lagos,
nairobi, johannesburg, cape town, dubai, abu dhabi, riyadh, tehran, baghdad, jerusalem,
tel aviv, mumbai, delhi, new delhi, bangalore, bengaluru, chennai, kolkata, karachi, lahore,
dhaka, bangkok, hanoi, ho chi minh city, jakarta, manila, kuala lumpur, seoul, tokyo, osaka,
kyoto, beijing, shanghai, shenzhen, guangzhou, hangzhou, nanjing, wuhan, chengdu,
chongqing, tianjin, xi'an, suzhou, hong kong, macau, taipei, sydney, melbourne, brisbane,
perth, auckland, mexico city, sao paulo, rio de janeiro, buenos aires, santiago, lima, bogota,
california, texas, florida, new jersey, massachusetts, illinois, ohio, michigan, virginia,
oregon, arizona, colorado, nevada, alaska, hawaii, bavaria, catalonia, flanders
""")

FIRST_NAMES = words("""
aaron adam adrian ahmed aisha alan albert alex alexander alexandra alice alicia amanda amelia
amir amy ana andrea andreas andrew angela anna anne anthony antonio arjun arthur astrid
barbara ben benjamin bernard beth bill bob brian bruce camille carl carlos caroline carmen
catherine charles charlie charlotte chen chloe chris christian christina christopher claire
clara daniel david deborah dennis diana dick diego dmitri dominic donald dorothy
edward elena elizabeth ella emily emma eric erik eva fatima felix fernando francesca
francis frank fred frederick gabriel george georgia gerald grace greg hannah hans harry helen
henry hugo ian ingrid isabel isabella jack jacob james jan jane jason javier jean jeff
jennifer jessica jim joanna joe johan johannes john jonas jonathan jorge jose joseph joshua
juan julia julie karen karl kate katherine keith ken kenji kevin klaus lars laura lei leo
lisa liu louis lucas lucy luis luke lukas marc marco margaret maria marie mark martha martin
mary matthew max mei michael michelle miguel mike ming mohammed muhammad nadia natalia nathan
nicholas nicole nina noah olga oliver olivia omar oscar pablo patricia patrick paul pedro
peter philip pierre priya rachel rahul raj rebecca richard robert roberto rosa ryan sam samuel
sandra sara sarah sebastian sergei simon sofia sophie stefan stephen steven susan thomas tim
timothy tom tomas tony victor victoria vincent wang wei william xavier yuki yusuf zhang janet
suzanne linda nancy betty helen ruth sharon donna carol
cynthia kathleen amy shirley angela brenda pamela nicole joan judith evelyn jean
heather diane julia gloria teresa doris
li wang zhang liu chen yang huang zhao wu zhou xu sun ma zhu hu guo he lin gao luo
""")

KNOWN_ORGS = _phrases("""
microsoft, google, alphabet, apple, amazon, meta, facebook, instagram, whatsapp, openai,
anthropic, nvidia, intel, amd, tesla, ibm, oracle, samsung, huawei, alibaba, tencent, baidu,
bytedance, tiktok, sony, toyota, honda, volkswagen, bmw, siemens, philips, asml, netflix, uber,
twitter, spacex, youtube, linkedin, github, nasa, fbi, cia, nato, un, united nations, who,
imf, world bank, reuters, bloomberg, bbc, cnn, congress, senate, parliament, pentagon,
white house, european commission, federal reserve, walmart, disney, boeing, airbus, shell, bp,
exxonmobil, pfizer, moderna, goldman sachs, jpmorgan, morgan stanley, visa, mastercard, paypal
""")

GENERIC_QUERY_WORDS = words("""
main key theme themes topic topics overview summary summarize summarise important dataset data
corpus document documents overall general major trend trends idea ideas discussed covered
content contents mentioned talk about everything anything what
top most issue issues subject subjects point points highlight highlights collection
article articles text texts file files material materials say says give list
""")

# English closed-class words that STOPWORDS leaves out, because STOPWORDS also shapes the stored
# lexical index and these do little harm there: prepositions, quantifiers, conjunctions and
# degree or frequency adverbs, and the verbs of asking ("find", "know"). A question is built with
# them; they never say what it is about, so query-time relevance (relevance.content_terms) drops
# them with the question scaffolding of GENERIC_QUERY_WORDS.
FUNCTION_WORDS = words("""
across along alongside amid amidst among amongst around behind beneath beside besides beyond
concerning despite except inside near onto outside per regarding throughout toward towards
underneath unlike versus via within without whether whose whatever whichever whoever whomever
wherever whenever however although though whereas thus hence therefore meanwhile moreover
furthermore nevertheless otherwise instead indeed perhaps maybe rather quite really just even
still already almost especially particularly mainly mostly largely generally usually often
always never sometimes frequently typically commonly recently currently several various certain
whole entire either neither another else anyone everyone someone somebody anybody everybody
nobody none lot lots kind kinds sort sorts way ways thing things
find know known regard related relating relate according based
""")

# Question grammar for routing a question (server/engines/router.py); English only, closed word
# classes rather than topics. Interrogatives that ask for one value: a count, an amount, a time,
# a place (matched as whole phrases at the start of a clause).
VALUE_QUESTIONS = _phrases("""
how many, how much, how long, how old, when, where, what year, which year,
what date, what day, what time, what percentage, what percent, what number, what price
""")
# Quantifiers, frequency adverbs and words for an overview: the question asks about what recurs
# across many documents.
SPREAD_WORDS = words("""
any all every various different multiple several common commonly recurring recur recurrent
often frequently frequent usually typically generally consistently repeatedly across
throughout trends patterns themes topics overview summary summarize summarise
""")
# Auxiliaries that agree with a plural subject ("what risks are", "how do teams"), and the
# singular ones; "did", "will" and modals agree with both and say nothing.
PLURAL_AUXILIARIES = words("are were have do")
SINGULAR_AUXILIARIES = words("is was has does")

# Claim cue stems -> claim type (Latin text is matched on word starts, lowercase).
CLAIM_CUES = {
    "accus": "ACCUSATION", "alleg": "ALLEGATION", "fined": "FINE", "penalt": "PENALTY",
    "recall": "RECALL", "failed": "FAILURE", "failure": "FAILURE", "violat": "VIOLATION",
    "sued": "LAWSUIT", "sues": "LAWSUIT", "lawsuit": "LAWSUIT", "convict": "CONVICTION",
    "indict": "INDICTMENT", "investigat": "INVESTIGATION", "breach": "BREACH", "banned": "BAN",
    "fraud": "FRAUD", "defect": "DEFECT", "misconduct": "MISCONDUCT", "bribe": "BRIBERY",
}

CLAIM_CUES_ZH = {
    "指控": "ACCUSATION", "涉嫌": "ALLEGATION", "罚款": "FINE", "处罚": "PENALTY", "召回": "RECALL",
    "失败": "FAILURE", "故障": "FAILURE", "违反": "VIOLATION", "违规": "VIOLATION",
    "起诉": "LAWSUIT", "诉讼": "LAWSUIT", "调查": "INVESTIGATION", "欺诈": "FRAUD",
    "缺陷": "DEFECT", "贿赂": "BRIBERY",
}

ORG_SUFFIXES_ZH = (
    "有限责任公司", "股份有限公司", "有限公司", "公司", "集团", "大学", "学院", "研究所", "研究院",
    "实验室", "银行", "协会", "委员会", "医院", "基金会", "出版社", "电视台", "政府", "法院",
    "工厂",
)

STOPWORDS_ZH = words("""
的 了 是 在 和 与 及 或 也 都 就 而 把 被 对 从 向 为 以 于 之 其 这 那 哪 什么 怎么 如何 为什么
哪些 我们 你们 他们 她们 它们 一个 没有 可以 因为 所以 但是 如果 还是 已经 进行 情况 问题 哪里 谁
""")

# Common words that jieba's dictionary tags as names (ns/nr); never entities on their own.
ZH_NOT_NAMES = words("""
城市 东西 南北 平原 外国 爱国 英雄 太阳 哥哥 海洋 朝廷 自治州 自治县 东北 西北 西南 东南 湖泊 大桥
高原 上市 美丽 山区 江湖 大街 王国 开国 共和国 城镇 大都 京城 阿哥 庆典 南路 深度 山脉 回国 治安
大国 新鲜 古城 海峡 建国 明白 武功 二人 文明 令人 小姐 小龙 和尚 王朝 阳光 陆军 道德 卫星 雷达 太后
荣誉 古老
""")
