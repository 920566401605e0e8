"""The appendix "The sources, checked" (book/sources_checked.md) and the glossary.

The two source articles live outside the repository, in ../shared/seeds/ (CI keeps
a copy of shared/ beside the clone). The appendix must quote them verbatim, quote
every number they print, and compute every number of its verdicts.
"""
import os
import re
from pathlib import Path

import pytest

from conftest import ROOT, require

PAGE = Path(ROOT) / "book" / "sources_checked.md"
GLOSSARY = Path(ROOT) / "book" / "glossary.md"
SOURCES = {"S1": "000_e09b0acf1a2fe2dd.txt", "S2": "001_a56bccf0dc18aee1.txt"}
VERDICTS = ("right", "imprecise", "wrong")


def seeds_dir():
    candidates = [os.environ.get("FLASHBOOK_SEEDS", ""), Path(ROOT).parent / "shared" / "seeds",
                  Path(ROOT) / "shared" / "seeds"]
    found = [Path(c) for c in candidates if c and (Path(c) / SOURCES["S1"]).exists()]
    require(bool(found), "the source articles are not in ../shared/seeds "
                         "(or set FLASHBOOK_SEEDS to their folder)")
    return found[0]


def seed_text(source):
    return (seeds_dir() / SOURCES[source]).read_text(encoding="utf-8")


def normalise(text):
    """What a quote must match: list numbers, math and code delimiters and runs of
    whitespace do not count, and the matrices' lost row separators are restored."""
    text = re.sub(r"(?m)^\s*\d+\.\s", " ", text)          # "1. " opening a list item
    text = text.replace("\\\\", "\\").replace("$", "").replace("`", "")
    return re.sub(r"\s+", " ", text).strip()


#: A number as the articles print it: 64, 0.707, 4096 (not the 16 of FP16 or the
#: 100 of A100, which are names).
NUMBER = re.compile(r"(?<![A-Za-z_\d.])\d+(?:\.\d+)?")


def claims():
    """{claim id: {"fragments": [...], "body": text up to the next claim}} in page order."""
    text = PAGE.read_text(encoding="utf-8")
    parts = re.split(r"(?m)^### (S\d\.\d+) ", text)
    out = {}
    for cid, body in zip(parts[1::2], parts[2::2]):
        body = re.split(r"(?m)^## ", body)[0]
        quotes = [line[2:].strip() for line in body.splitlines() if line.startswith("> 「")]
        fragments = []
        for q in quotes:
            assert q.startswith("「") and q.endswith("」"), f"{cid}: {q[:40]}"
            fragments += q[1:-1].split("」 … 「")
        out[cid] = {"fragments": fragments, "body": body}
    return out


def test_claims_are_numbered_and_each_has_quote_translation_verdict_and_chapter():
    found = claims()
    for source in SOURCES:
        ids = [c for c in found if c.startswith(source + ".")]
        assert ids == [f"{source}.{i}" for i in range(1, len(ids) + 1)], ids
        assert len(ids) >= 10
    for cid, claim in found.items():
        body = claim["body"]
        assert claim["fragments"], f"{cid} quotes nothing"
        assert re.search(r'(?m)^> "', body), f"{cid} has no translation"
        verdicts = re.findall(r"\*\*Verdict: (\w+)", body)
        assert verdicts and set(verdicts) <= set(VERDICTS), f"{cid}: verdict {verdicts}"
        assert "{doc}`../notebooks/" in body, f"{cid} links no chapter"


def test_every_quote_is_verbatim():
    for cid, claim in claims().items():
        source = normalise(seed_text(cid.split(".")[0]))
        for fragment in claim["fragments"]:
            assert normalise(fragment) in source, f"{cid} misquotes: {fragment}"


def test_every_number_the_sources_print_is_quoted():
    found = claims()
    for source in SOURCES:
        text = normalise(seed_text(source))
        covered = [False] * len(text)
        for cid, claim in found.items():
            if cid.startswith(source + "."):
                for fragment in map(normalise, claim["fragments"]):
                    for m in re.finditer(re.escape(fragment), text):
                        covered[m.start():m.end()] = [True] * (m.end() - m.start())
        numbers = list(NUMBER.finditer(text))
        assert len(numbers) > 30
        missing = [f"{m.group()} in '…{text[max(0, m.start() - 25):m.end() + 10]}…'"
                   for m in numbers if not all(covered[m.start():m.end()])]
        assert missing == [], f"{source}: numbers not quoted: {missing}"


CELL = re.compile(r"```\{code-cell\} ipython3\n(.*?)```", re.S)


def test_the_arithmetic_runs_and_every_glued_number_is_computed(monkeypatch):
    """Run the page's code cells (their asserts check the verdicts); every
    {glue:text} name the prose quotes must be glued by them."""
    import flashbook.display as display

    glued = {}
    monkeypatch.setattr(display, "glue", lambda name, value, display=True: glued.update({name: value}))
    text = PAGE.read_text(encoding="utf-8")
    namespace = {}
    cells = CELL.findall(text)
    assert len(cells) >= 20
    for cell in cells:
        code = "\n".join(line for line in cell.splitlines() if not line.startswith(":tags:"))
        exec(compile(code, str(PAGE), "exec"), namespace)
    used = set(re.findall(r"\{glue:text\}`(\w+)", text))
    assert used and used <= set(glued), f"not computed: {sorted(used - set(glued))}"
    assert glued["s211_den"] == "6.4803" and glued["s213_n0"] == "4.7683"
    assert glued["s12_mib"] == "32"


# The glossary's Chinese terms, as the sources write them: each must occur there.
@pytest.mark.parametrize("term", ["分块", "在线 softmax", "重计算", "显存", "共享内存", "算子融合"])
def test_glossary_has_the_chinese_terms(term):
    assert term in GLOSSARY.read_text(encoding="utf-8")


def test_glossary_terms_marked_as_the_sources_write_them_occur_there():
    text = GLOSSARY.read_text(encoding="utf-8")
    marked = re.findall(r"「([^」]+)」", text)
    assert len(marked) >= 15
    both = seed_text("S1") + seed_text("S2")
    assert [t for t in marked if t not in both] == []
