"""Rebuild the bundled real sample (manifests/sample/) from locally installed inputs.

This is how the committed sample was made; `hymo run` never calls it (nothing
is downloaded at run time). It needs, on a Debian 12 machine:

    apt-get install python3.11-doc fortunes fortunes-zh fortunes-de \
        fortunes-es fortunes-it fortunes-ru fortunes-br
    pip download --no-deps gensim==4.4.0          # wheel holds a Wikipedia dump excerpt
    pip download --no-deps --no-binary :all: pycld2==0.42
    pip install mwparserfromhell                  # wikitext -> plain text (build only)

and writes

    sample/python-docs/**.html           raw pages of the Python 3.11 docs
    sample/prose-enwiki/enwiki.jsonl     Wikipedia article sections (partition A)
    sample/generator_pool/enwiki.jsonl   Wikipedia article sections (partition B),
                                         the clean input of sample_generator.py
    sample/multilingual/multilingual.jsonl  fortunes + cld2 test snippets with
                                         a ground-truth `label_lang`

Usage:
    python -m manifests.build_sample_sources \
        --gensim-wheel gensim-4.4.0-*.whl --pycld2-sdist pycld2-0.42.tar.gz
"""
from __future__ import annotations

import argparse
import bz2
import hashlib
import json
import re
import shutil
import subprocess
import tarfile
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

SAMPLE_DIR = Path(__file__).resolve().parent / "sample"

# ---------------------------------------------------------------------------
# python-docs: a deterministic, varied subset of raw HTML pages
# ---------------------------------------------------------------------------
PYDOCS_ROOT = Path("/usr/share/doc/python3.11/html")
PYDOCS_SECTIONS = ("tutorial", "howto", "reference", "faq", "library", "c-api",
                   "extending", "using", "installing", "distributing", "distutils",
                   "whatsnew")
PYDOCS_TOP_LEVEL = ("about.html", "bugs.html", "copyright.html", "license.html",
                    "glossary.html", "download.html")
PYDOCS_SMALL_PAGE_BYTES = 45_000     # most pages kept are at most this big
PYDOCS_MID_PAGE_BYTES = 300_000      # pages above this are never kept
PYDOCS_MID_PAGES_KEPT = 2            # how many pages between the two limits to keep
PYDOCS_MAX_PAGES = 300


def select_python_docs(root: Path = PYDOCS_ROOT) -> list[Path]:
    """Relative paths of the pages to bundle, sorted.

    All small pages of the hand-written sections (tutorial, howto, reference,
    faq, ...) are kept; library/ and c-api/ are thinned by a fixed stride so
    the whole stays near PYDOCS_MAX_PAGES; the two smallest mid-size pages of
    the tutorial and howto sections are added so one long page is present.
    """
    small: dict[str, list[Path]] = {}
    mid: list[tuple[int, Path]] = []
    for section in PYDOCS_SECTIONS:
        for page in sorted((root / section).rglob("*.html")):
            size = page.stat().st_size
            rel = page.relative_to(root)
            if size <= PYDOCS_SMALL_PAGE_BYTES:
                small.setdefault(section, []).append(rel)
            elif size <= PYDOCS_MID_PAGE_BYTES and section in ("tutorial", "howto"):
                mid.append((size, rel))
    chosen = [Path(name) for name in PYDOCS_TOP_LEVEL if (root / name).exists()]
    for section, pages in small.items():
        if section not in ("library", "c-api"):
            chosen.extend(pages)
    budget = PYDOCS_MAX_PAGES - len(chosen) - PYDOCS_MID_PAGES_KEPT
    thinned = small.get("library", []) + small.get("c-api", [])
    stride = max(1, -(-len(thinned) // budget))
    chosen.extend(thinned[::stride][:budget])
    chosen.extend(rel for _, rel in sorted(mid)[:PYDOCS_MID_PAGES_KEPT])
    return sorted(set(chosen))


def build_python_docs(out_dir: Path) -> int:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    pages = select_python_docs()
    for rel in pages:
        dest = out_dir / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PYDOCS_ROOT / rel, dest)
    return len(pages)


# ---------------------------------------------------------------------------
# prose: English Wikipedia articles from the dump excerpt in gensim's test data
# ---------------------------------------------------------------------------
ENWIKI_MEMBER = ("gensim/test/test_data/"
                 "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
MIN_SECTION_WORDS = 80
MAX_SECTION_CHARS = 12_000
SKIPPED_SECTIONS = {"see also", "references", "external links", "further reading",
                    "notes", "bibliography", "sources", "footnotes", "citations"}
GENERATOR_POOL_SHARE = 0.5      # fraction of articles (by title hash) for the generator


IMAGE_OPTIONS = re.compile(r"(^|\|)(thumb|thumbnail|frame|upright|left|right|center|"
                           r"alt=[^|]*|\d+(x\d+)?px)\|")


def _plain_wikitext(wikitext: str) -> str:
    import mwparserfromhell

    code = mwparserfromhell.parse(wikitext)
    for tag in code.filter_tags(recursive=True):
        if str(tag.tag).lower() in ("ref", "table", "gallery", "math", "timeline"):
            try:
                code.remove(tag)
            except ValueError:
                pass
    for link in code.filter_wikilinks(recursive=True):
        if str(link.title).strip().lower().startswith(("file:", "image:", "category:")):
            try:
                code.remove(link)
            except ValueError:
                pass
    text = code.strip_code(normalize=True, collapse=True)
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("{|", "|", "!", "File:", "Image:")):
            continue
        if IMAGE_OPTIONS.search(line):          # caption remnants of nested image links
            continue
        lines.append(re.sub(r"[ \t]+", " ", line))
    return "\n".join(lines)


def _sections(title: str, wikitext: str) -> list[tuple[str, str]]:
    """Split an article at level-2 headings into (section title, plain text)."""
    parts = re.split(r"^==([^=].*?)==\s*$", wikitext, flags=re.M)
    named = [("", parts[0])] + [(parts[i].strip(), parts[i + 1])
                                for i in range(1, len(parts) - 1, 2)]
    sections = []
    for name, body in named:
        if name.lower() in SKIPPED_SECTIONS:
            continue
        text = _plain_wikitext(body)
        if len(text.split()) < MIN_SECTION_WORDS:
            continue
        if len(text) > MAX_SECTION_CHARS:
            cut = text.rfind("\n", 0, MAX_SECTION_CHARS)
            text = text[: cut if cut > 0 else MAX_SECTION_CHARS]
        sections.append((name, text))
    return sections


def _enwiki_records(dump_xml: bytes) -> list[dict]:
    ns = "{http://www.mediawiki.org/xml/export-0.10/}"
    root = ET.fromstring(dump_xml)
    records = []
    for page in root.iter(f"{ns}page"):
        if page.findtext(f"{ns}ns") != "0" or page.find(f"{ns}redirect") is not None:
            continue
        title = page.findtext(f"{ns}title")
        revision = page.find(f"{ns}revision")
        wikitext = revision.findtext(f"{ns}text") or ""
        if wikitext.lstrip().lower().startswith("#redirect"):
            continue
        for name, text in _sections(title, wikitext):
            url = "https://en.wikipedia.org/wiki/" + title.replace(" ", "_")
            if name:
                url += "#" + name.replace(" ", "_")
            records.append({
                "text": text,
                "url": url,
                "meta": {"title": title, "section": name,
                         "revision_id": revision.findtext(f"{ns}id"),
                         "timestamp": revision.findtext(f"{ns}timestamp")},
            })
    return records


def _in_generator_pool(title: str) -> bool:
    digest = hashlib.sha256(title.encode("utf-8")).digest()
    return digest[0] / 256 < GENERATOR_POOL_SHARE


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")


def build_prose(gensim_wheel: Path) -> tuple[int, int]:
    with zipfile.ZipFile(gensim_wheel) as wheel:
        dump_xml = bz2.decompress(wheel.read(ENWIKI_MEMBER))
    records = _enwiki_records(dump_xml)
    # The same section title can occur twice in one article; make urls unique.
    seen: dict[str, int] = {}
    for record in records:
        count = seen.get(record["url"], 0)
        seen[record["url"]] = count + 1
        if count:
            record["url"] += f"_{count + 1}"
    pool = [r for r in records if _in_generator_pool(r["meta"]["title"])]
    prose = [r for r in records if not _in_generator_pool(r["meta"]["title"])]
    write_jsonl(SAMPLE_DIR / "prose-enwiki" / "enwiki.jsonl", prose)
    write_jsonl(SAMPLE_DIR / "generator_pool" / "enwiki.jsonl", pool)
    return len(prose), len(pool)


# ---------------------------------------------------------------------------
# multilingual: Debian fortunes (joined into documents) + cld2 unit-test snippets
# ---------------------------------------------------------------------------
FORTUNES = Path("/usr/share/games/fortunes")
# lang -> (debian package, licence of the texts, fortune files, documents kept)
FORTUNE_SETS = {
    "zh": ("fortunes-zh", "GPL-3.0-or-later", ["chinese", "tang300", "song100"], 150),
    "de": ("fortunes-de", "GPL-2.0-or-later",
           ["de/" + n for n in ("anekdoten", "bahnhof", "computer", "debian", "elefanten",
                                "gedichte", "kinderzitate", "letzteworte", "mathematiker",
                                "murphy", "sprichworte", "sprueche", "stilblueten", "tips",
                                "wusstensie", "zitate")], 60),
    "es": ("fortunes-es", "public-domain (per debian/copyright)",
           ["es/" + n + ".fortunes" for n in ("amistad", "arte", "ciencia", "familia",
                                              "filosofia", "humanos", "informatica",
                                              "libertad", "poder", "proverbios",
                                              "refranes", "sabiduria", "vida")], 60),
    "it": ("fortunes-it", "public-domain (per debian/copyright)",
           ["it/" + n for n in ("adams", "computer", "definizioni", "formiche", "italia",
                                "leggi", "luttazzi", "norm", "zuse")], 60),
    "ru": ("fortunes-ru", "GPL-2.0-only",
           ["ru/" + n for n in ("life", "knowledge", "truth", "time", "work", "success",
                                "education", "citates", "friendship", "future", "book")], 60),
    "pt": ("fortunes-br", "GPL-2.0-or-later", ["brasil"], 60),
    "en": ("fortunes", "BSD-3-Clause",
           ["literature", "wisdom", "science", "people", "education", "work"], 60),
}
DOC_MIN_CHARS = 300
DOC_MAX_CHARS = 1000
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def _dpkg_version(package: str) -> str:
    return subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                          check=True, capture_output=True, text=True).stdout


def _fortune_entries(path: Path) -> list[str]:
    raw = path.read_bytes().decode("utf-8", errors="replace")
    entries = []
    for entry in re.split(r"^%\s*$", ANSI_ESCAPE.sub("", raw), flags=re.M):
        lines = [line.rstrip() for line in entry.strip("\n").splitlines()]
        text = "\n".join(lines).strip()
        if text:
            entries.append(text)
    return entries


def _fortune_documents(rel: str) -> list[tuple[str, int, int]]:
    """Join consecutive entries into documents of DOC_MIN..DOC_MAX characters."""
    entries = _fortune_entries(FORTUNES / rel)
    documents, current, first = [], [], 0
    for index, entry in enumerate(entries):
        if len(entry) > DOC_MAX_CHARS:        # over-long entries stand alone or not at all
            continue
        if current and sum(map(len, current)) + len(entry) > DOC_MAX_CHARS:
            if sum(map(len, current)) >= DOC_MIN_CHARS:
                documents.append(("\n\n".join(current), first, index - 1))
            current = []
        if not current:
            first = index
        current.append(entry)
    if current and sum(map(len, current)) >= DOC_MIN_CHARS:
        documents.append(("\n\n".join(current), first, len(entries) - 1))
    return documents


def fortune_records() -> list[dict]:
    records = []
    for lang, (package, licence, files, wanted) in FORTUNE_SETS.items():
        version = _dpkg_version(package)
        per_file = [(rel, _fortune_documents(rel)) for rel in files]
        picked, round_index = [], 0
        while len(picked) < wanted and any(round_index < len(d) for _, d in per_file):
            for rel, documents in per_file:
                if round_index < len(documents) and len(picked) < wanted:
                    picked.append((rel, documents[round_index]))
            round_index += 1
        for rel, (text, first, last) in picked:
            records.append({
                "text": text,
                "url": f"file:///usr/share/games/fortunes/{rel}#entries-{first}-{last}",
                "meta": {"label_lang": lang, "origin": f"debian:{package}={version}",
                         "license": licence},
            })
    return records


CLD2_MEMBER = "pycld2-0.42/cld2/internal/unittest_data.h"
CLD2_LANG_ALIASES = {"iw": "he", "jw": "jv"}     # old codes -> fastText lid.176 codes
CLD2_MIN_CHARS = 50
CLD2_SKIPPED = re.compile(r"^version|^(xx|zz.|sit)_|_(close|bad_UTF8)$|^fr_en_")


C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}


def _c_string(body: str) -> str:
    """Decode the simple escapes used in the cld2 header (the one \\x string is skipped)."""
    return re.sub(r"\\(.)", lambda m: C_ESCAPES.get(m.group(1), m.group(1)), body)


def cld2_records(pycld2_sdist: Path) -> list[dict]:
    with tarfile.open(pycld2_sdist) as sdist:
        header = sdist.extractfile(CLD2_MEMBER).read().decode("utf-8")
    utf8_part = header.split("#else", 1)[0]
    records = []
    for name, literal in re.findall(
            r'^const char\* kTeststr_(\w+) =\s*((?:"(?:[^"\\]|\\.)*"\s*)+);',
            utf8_part, flags=re.M):
        if CLD2_SKIPPED.search(name):
            continue
        text = "".join(_c_string(s[1:-1])
                       for s in re.findall(r'"(?:[^"\\]|\\.)*"', literal))
        text = " ".join(text.split())
        if len(text) < CLD2_MIN_CHARS:
            continue
        code, script = name.split("_")[0], name.split("_")[-1].rstrip("0123456789")
        records.append({
            "text": text,
            "url": f"https://github.com/aboSamoor/pycld2/blob/v0.42/cld2/internal/"
                   f"unittest_data.h#kTeststr_{name}",
            "meta": {"label_lang": CLD2_LANG_ALIASES.get(code, code),
                     "label_script": script, "origin": "pypi:pycld2==0.42 sdist",
                     "license": "Apache-2.0"},
        })
    seen = set()
    unique = []
    for record in records:                 # two snippets share a name in the header
        if record["url"] not in seen:
            seen.add(record["url"])
            unique.append(record)
    return unique


def build_multilingual(pycld2_sdist: Path) -> int:
    records = fortune_records() + cld2_records(pycld2_sdist)
    write_jsonl(SAMPLE_DIR / "multilingual" / "multilingual.jsonl", records)
    return len(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gensim-wheel", type=Path, required=True)
    parser.add_argument("--pycld2-sdist", type=Path, required=True)
    args = parser.parse_args()
    print("python-docs pages:", build_python_docs(SAMPLE_DIR / "python-docs"))
    print("enwiki sections (prose, generator pool):", build_prose(args.gensim_wheel))
    print("multilingual documents:", build_multilingual(args.pycld2_sdist))


if __name__ == "__main__":
    main()
