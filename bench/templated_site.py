"""A templated site for near-duplicate recall: pages sharing one boilerplate block, planted copies, and exact all-pairs truth.

Every page is header + its own words + footer, the header and footer being
one fixed boilerplate block that makes up 60–85 % of the page's words. Whole
LSH bands then agree on the boilerplate's minima, so thousands of pages share
a bucket and a true near-copy pair can sit anywhere in it. Planted on top:
near copies of some pages (edited until their exact Jaccard with the page
lies in 0.80–0.95, to be removed) and looser variants (0.60–0.78, to stay).

Truth is the exact Jaccard of every pair of documents (tasks/dedup/pair_jaccard.py,
checked against pair-by-pair jaccard_of_sets in the tests): the 16M pairs of
5,700 documents took 9–23 s here under load, not hours of a Python loop.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.dedup.minhash import UnionFind
from tasks.dedup.pair_jaccard import pairs_at_least as exact_pairs
from tasks.dedup.shingles import TokenHashCache, batch_ngram_hashes, jaccard_of_sets, sorted_set, tokens

@dataclass(frozen=True)
class TemplatedSite:
    ids: list[str]
    texts: list[str]
    planted_copy: dict[str, float]  # copy id -> its Jaccard with its page (0.80–0.95)
    planted_variant: dict[str, float]  # variant id -> its Jaccard with its page (0.60–0.78)


def shingle_set(text: str, cache: TokenHashCache) -> np.ndarray:
    hashes, _ = batch_ngram_hashes([tokens(text)], 5, cache)
    return sorted_set(hashes)


def edited_to(words: list[str], editable: range, band: tuple[float, float], rng: np.random.Generator, vocab: np.ndarray,
              cache: TokenHashCache) -> tuple[str, float] | None:
    """Replace words of `editable` (in a fixed random order) until the Jaccard with the original falls into `band`."""
    original = shingle_set(" ".join(words), cache)
    order = rng.permutation(np.asarray(editable))
    replacements = vocab[rng.integers(0, len(vocab), size=len(order))]
    low, high = 0, len(order)
    while low < high:  # fewest edits whose Jaccard is ≤ the band's top
        middle = (low + high) // 2
        changed = list(words)
        for position, word in zip(order[:middle].tolist(), replacements[:middle].tolist()):
            changed[position] = word
        similarity = jaccard_of_sets(original, shingle_set(" ".join(changed), cache))
        if similarity > band[1]:
            low = middle + 1
        else:
            high = middle
    changed = list(words)
    for position, word in zip(order[:low].tolist(), replacements[:low].tolist()):
        changed[position] = word
    text = " ".join(changed)
    similarity = jaccard_of_sets(original, shingle_set(text, cache))
    return (text, similarity) if band[0] <= similarity <= band[1] else None


def templated_site(pages: int, copies: int, variants: int, seed: int = 2026, boilerplate_words: int = 320) -> TemplatedSite:
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(rng.choice(letters, size=rng.integers(3, 10))) for _ in range(30_000)])
    boilerplate = vocab[rng.integers(0, len(vocab), size=boilerplate_words)].tolist()
    header, footer = boilerplate[: boilerplate_words // 2], boilerplate[boilerplate_words // 2:]
    cache = TokenHashCache()
    ids, texts, page_words = [], [], []
    for page in range(pages):
        share = rng.uniform(0.60, 0.85)  # boilerplate's share of the page's words
        own = vocab[rng.integers(0, len(vocab), size=max(5, round(boilerplate_words * (1 - share) / share)))].tolist()
        words = header + own + footer
        ids.append(f"tpl-{page:06d}")
        texts.append(" ".join(words))
        page_words.append(words)
    planted_copy, planted_variant = {}, {}
    chosen = rng.choice(pages, size=copies + variants, replace=False).tolist()
    for number, page in enumerate(chosen):
        words = page_words[page]
        editable = range(len(header), len(words) - len(footer))
        want_copy = number < copies
        low = rng.uniform(0.80, 0.95) if want_copy else rng.uniform(0.60, 0.78)
        band = (low, min(0.95, low + 0.02)) if want_copy else (max(0.60, low - 0.02), low)
        made = edited_to(words, editable, band, rng, vocab, cache)
        if made is None:  # a page with little own text cannot reach the band: plant on the next page instead
            continue
        text, similarity = made
        doc_id = f"tpl-{pages + number:06d}"  # not next to its page in id order, as with real URLs
        (planted_copy if want_copy else planted_variant)[doc_id] = similarity
        ids.append(doc_id)
        texts.append(text)
    return TemplatedSite(ids, texts, planted_copy, planted_variant)


def pairs_at_least(texts: list[str], threshold: float) -> list[tuple[int, int, float]]:
    """Every pair (i < j) whose exact 5-gram Jaccard is ≥ threshold: all pairs, no sampling, no LSH."""
    cache = TokenHashCache()
    sets = [shingle_set(text, cache) for text in texts]
    firsts, seconds, similarities = exact_pairs(sets, threshold, dense_bytes_limit=1 << 40)
    return list(zip(firsts.tolist(), seconds.tolist(), similarities.tolist()))


def removals_from_pairs(ids: list[str], pairs: list[tuple[int, int, float]]) -> set[str]:
    """Ids the truth removes: every member of a cluster of pairs but its smallest id."""
    rank = np.argsort(np.array(ids))
    rank_of = np.empty(len(ids), dtype=np.int64)
    rank_of[rank] = np.arange(len(ids))
    clusters = UnionFind(len(ids))
    for a, b, _ in pairs:
        clusters.union(int(rank_of[a]), int(rank_of[b]))
    return {ids[int(rank[r])] for r in range(len(ids)) if clusters.find(r) != r}
