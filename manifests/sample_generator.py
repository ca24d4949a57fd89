"""Labelled junk and copies for the bundled sample (seed 001, Lab 1).

Takes clean English prose (Wikipedia sections from the generator pool, a set
of articles that is *not* in the prose-enwiki source) and writes one JSONL
file holding the originals plus known junk and known copies, so the quality
and dedup stages can be scored against ground truth:

    clean          the pool documents, verbatim
    navigation     menu-like lines of link texts ("Home | Products | Support")
    spam           symbol-, ellipsis- and hashtag-heavy shouting
    repeated_line  one sentence of a clean document repeated 8-15 times
    short          the first 5-25 words of a clean document
    exact_copy     a clean document verbatim; source_id = the original's url
    near_copy      a clean document with each word independently replaced,
                   with probability q, by a word from a small vocabulary;
                   q in NEAR_COPY_RATES, source_id = the original's url,
                   true_jaccard = exact Jaccard of the word-5-gram shingle
                   sets of copy and original (see `shingles`)

As the seed warns, a near_copy label records provenance, not similarity: at
q = 0.01 a copy may come out unchanged (true_jaccard = 1.0).

Every random choice comes from one random.Random(seed); the output is
byte-identical across runs and machines. Records carry meta keys label,
source_id, q and true_jaccard (null where they do not apply).

    python -m manifests.sample_generator --out manifests/sample/generated.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_POOL = PACKAGE_DIR / "sample" / "generator_pool" / "enwiki.jsonl"
DEFAULT_OUT = PACKAGE_DIR / "sample" / "generated.jsonl"
GENERATED_URL_PREFIX = "generated://sample/"

NEAR_COPY_RATES = (0.01, 0.03, 0.05, 0.08, 0.12, 0.20)   # seed 001, Lab 1
SHINGLE_WORDS = 5                                          # seed 001: five-word shingles

MENU_ITEMS = ("Home", "Products", "Support", "Prices", "Contact", "About", "Blog",
              "News", "Careers", "Log in", "Sign up", "Help", "Search", "Cart",
              "Privacy", "Terms of use", "Downloads", "Community", "Events", "Shop")
SPAM_TOKENS = ("BUY", "NOW!!!", "$$$", "#deal", "#sale", "CHEAP", ">>>", "***", "100%",
               "FREE", "CLICK", "HERE...", "#win", "LIMITED...", "OFFER!!!", "#bonus",
               "...", "WOW", "#free", "$$$$")
REPLACEMENT_WORDS = ("river", "signal", "engine", "garden", "window", "copper",
                     "harbor", "lantern")


@dataclass(frozen=True)
class GeneratorConfig:
    seed: int = 1234
    clean: int | None = None          # None: every pool document
    navigation: int = 40
    spam: int = 40
    repeated_line: int = 40
    short: int = 40
    exact_copy: int = 40
    near_copy_per_rate: int = 10
    near_copy_rates: tuple[float, ...] = NEAR_COPY_RATES


def shingles(text: str, n: int = SHINGLE_WORDS) -> set[tuple[str, ...]]:
    """Set of word n-grams after lower-casing and whitespace splitting."""
    words = text.lower().split()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: set, b: set) -> float:
    union = a | b
    return len(a & b) / len(union) if union else 1.0


def first_sentence(text: str) -> str:
    match = re.match(r"\s*(.+?[.!?])(\s|$)", text, flags=re.S)
    sentence = match.group(1) if match else text.strip().splitlines()[0]
    return " ".join(sentence.split())


def navigation_text(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(8, 16)):
        items = rng.sample(MENU_ITEMS, rng.randint(4, 8))
        lines.append(rng.choice((" | ", " · ", "  ", " > ")).join(items))
    return "\n".join(lines)


def spam_text(rng: random.Random) -> str:
    return " ".join(rng.choices(SPAM_TOKENS, k=rng.randint(60, 120)))


def repeated_line_text(rng: random.Random, source_text: str) -> str:
    return "\n".join([first_sentence(source_text)] * rng.randint(8, 15))


def short_text(rng: random.Random, source_text: str) -> str:
    return " ".join(source_text.split()[:rng.randint(5, 25)])


def near_copy_text(rng: random.Random, source_text: str, q: float) -> str:
    """Replace each word independently with probability q; keep the whitespace."""
    pieces = re.split(r"(\s+)", source_text)
    for i in range(0, len(pieces), 2):          # even positions are words (or "")
        if pieces[i] and rng.random() < q:
            pieces[i] = rng.choice(REPLACEMENT_WORDS)
    return "".join(pieces)


def _record(text: str, url: str, label: str, source_id: str | None = None,
            q: float | None = None, true_jaccard: float | None = None) -> dict:
    return {"text": text, "url": url,
            "meta": {"label": label, "source_id": source_id, "q": q,
                     "true_jaccard": true_jaccard}}


def generate(pool: list[dict], config: GeneratorConfig = GeneratorConfig()) -> list[dict]:
    """Records in a fixed order: clean, the four junk kinds, exact, near copies."""
    rng = random.Random(config.seed)
    originals = pool if config.clean is None else pool[:config.clean]
    n_copies = config.exact_copy + config.near_copy_per_rate * len(config.near_copy_rates)
    if n_copies > len(originals):
        raise ValueError(f"{n_copies} copies need as many distinct originals; "
                         f"the pool has {len(originals)}")
    records = [_record(doc["text"], doc["url"], "clean") for doc in originals]

    def generated_url(label: str, index: int) -> str:
        return f"{GENERATED_URL_PREFIX}{label}/{index:04d}"

    for i in range(config.navigation):
        records.append(_record(navigation_text(rng), generated_url("navigation", i),
                               "navigation"))
    for i in range(config.spam):
        records.append(_record(spam_text(rng), generated_url("spam", i), "spam"))
    for i in range(config.repeated_line):
        source = originals[rng.randrange(len(originals))]
        records.append(_record(repeated_line_text(rng, source["text"]),
                               generated_url("repeated_line", i), "repeated_line"))
    for i in range(config.short):
        source = originals[rng.randrange(len(originals))]
        records.append(_record(short_text(rng, source["text"]),
                               generated_url("short", i), "short"))

    # Each copied original is used once, so a duplicate family is {original, copy}.
    copied = rng.sample(range(len(originals)), n_copies)
    for i, index in enumerate(copied[:config.exact_copy]):
        source = originals[index]
        records.append(_record(source["text"], generated_url("exact_copy", i), "exact_copy",
                               source_id=source["url"], true_jaccard=1.0))
    near_sources = iter(copied[config.exact_copy:])
    near_index = 0
    for q in config.near_copy_rates:
        for _ in range(config.near_copy_per_rate):
            source = originals[next(near_sources)]
            text = near_copy_text(rng, source["text"], q)
            records.append(_record(
                text, generated_url("near_copy", near_index), "near_copy",
                source_id=source["url"], q=q,
                true_jaccard=jaccard(shingles(text), shingles(source["text"]))))
            near_index += 1
    return records


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Generate the labelled sample source.")
    parser.add_argument("--pool", type=Path, default=DEFAULT_POOL,
                        help="JSONL of clean documents (text, url)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=GeneratorConfig.seed)
    args = parser.parse_args(argv)
    records = generate(read_jsonl(args.pool), GeneratorConfig(seed=args.seed))
    write_jsonl(args.out, records)
    print(f"wrote {len(records)} records to {args.out}")


if __name__ == "__main__":
    main()
