"""The data report page: one HTML file, its data as JSON in the page, drawn by inline JavaScript as SVG.

No server, no CDN, no external file: it opens from disk, offline, in any browser. The Python side only
serialises `flows.data_report.gather`'s answer; everything a person moves (a threshold, the search box)
is computed in the page from that data, so the page never goes back to the run directory.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from manifests.atomic import atomic_write_bytes

REPORT_FILE = "report.html"

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1180px;padding:0 18px 60px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:34px;border-bottom:1px solid #ddd}h3{font-size:15px;margin:18px 0 4px}
table{border-collapse:collapse;margin:6px 0}td,th{padding:2px 9px;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left}.note{color:#666;font-size:12.5px}.warn{color:#a40;font-weight:600}
.rule{border:1px solid #e3e3e3;border-radius:6px;padding:8px 12px;margin:12px 0}.doc{white-space:pre-wrap;font:12px/1.4 ui-monospace,monospace;
background:#fafafa;border:1px solid #eee;padding:6px;margin:4px 0;max-height:180px;overflow:auto}
mark{background:#ffe08a}mark.edit{background:#ffb3b3}.fired{color:#b22}.passed{color:#274}code,.command{font:12px ui-monospace,monospace}
.command{background:#f3f3f3;padding:4px 6px;display:block;margin:4px 0;user-select:all}.cols{display:flex;gap:16px;flex-wrap:wrap}
.cols>div{flex:1;min-width:300px}input.whatif{width:320px}pre{white-space:pre-wrap}
"""

SCRIPT = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const $ = (sel, root) => (root || document).querySelector(sel);
const el = (tag, attrs, ...kids) => { const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k))); return e; };
const svgNS = 'http://www.w3.org/2000/svg';
const sv = (tag, attrs, text) => { const e = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; return e; };
const fmt = n => n === null || n === undefined ? '—' : Number(n).toLocaleString('en-US');
const num = v => Number.isInteger(v) ? String(v) : String(+Number(v).toPrecision(6));
const shq = s => /^[\w@%+=:,./-]+$/.test(s) ? s : "'" + s.replace(/'/g, "'\\''") + "'";

function funnel() {
  const rows = D.funnel.filter(r => r.documents), box = $('#funnel');
  if (!rows.length) { box.append(el('p', {}, 'no document stage has been published yet')); return; }
  const width = 600, bar = 24, gap = 10, left = 120, max = Math.max(...rows.map(r => r.in), 1);
  const svg = sv("svg", {width: width + 520, height: rows.length * (bar + gap) + 10, role: 'img'});
  rows.forEach((r, i) => {
    const removed = Object.values(r.removed).reduce((a, b) => a + b, 0), y = 5 + i * (bar + gap);
    const g = sv('g', {'class': 'funnel-stage', 'data-stage': r.stage, 'data-in': r.in, 'data-kept': r.kept, 'data-removed': removed});
    g.append(sv('text', {x: 0, y: y + bar * 0.7}, r.stage));
    g.append(sv('rect', {x: left, y, width: width * r.kept / max, height: bar, fill: '#4c72b0'}));
    g.append(sv('rect', {x: left + width * r.kept / max, y, width: width * removed / max, height: bar, fill: '#d9534f'}));
    const top = Object.entries(r.removed).sort((a, b) => b[1] - a[1]).slice(0, 2).map(([k, v]) => k + ' ' + fmt(v)).join(', ');
    g.append(sv('text', {x: left + width * r.in / max + 6, y: y + bar * 0.7, 'font-size': 12},
      `in ${fmt(r.in)} → kept ${fmt(r.kept)}` + (removed ? ` (−${fmt(removed)}: ${top})` : '')));
    svg.append(g);
  });
  box.append(svg);
}

function table(box, header, rows) {
  const t = el('table', {}, el('tr', {}, ...header.map(h => el('th', {}, h))));
  for (const r of rows) t.append(el('tr', {}, ...r.map(c => el('td', {}, c))));
  box.append(t);
}

function highlighted(text, spans, cls) {
  const box = el('div', {'class': 'doc'}); let at = 0;
  for (const [start, end, label] of spans) {
    if (start < at) continue;
    box.append(text.slice(at, start)); box.append(el('mark', {title: label, 'class': cls || ''}, text.slice(start, end))); at = end;
  }
  box.append(text.slice(at)); return box;
}

const fires = (v, t, when) => when === '<' ? v < t : when === '<=' ? v <= t : when === '>=' ? v >= t : v > t;

function predict(rule, ci, t) {
  let total = 0;
  for (const e of rule.entries) {
    if (e.report_only) continue;
    const thr = e.path === ci ? t : (e.path >= 0 ? rule.controls[e.path].current : rule.threshold);
    let c = 0; for (const v of e.values) if (fires(v, thr, rule.fires_when)) c++;
    total += e.weight * c;
  }
  return Math.round(total);
}

function histogram(rule) {
  const values = [], weights = [];
  for (const e of rule.entries) for (const v of e.values) { values.push(v); weights.push(e.weight); }
  const thr = rule.threshold, lo = Math.min(...values, thr ?? Infinity), hi = Math.max(...values, thr ?? -Infinity);
  const integer = values.every(Number.isInteger) && Number.isInteger(thr ?? 0);
  let bins = 30; if (integer) bins = Math.max(1, Math.min(30, hi - lo + 1));
  const step = (hi - lo) / bins || 1, counts = new Array(bins).fill(0);
  values.forEach((v, i) => { counts[Math.min(bins - 1, Math.floor((v - lo) / step))] += weights[i]; });
  const total = Math.round(weights.reduce((a, b) => a + b, 0));
  const W = 520, H = 150, top = Math.max(...counts, 1);
  const svg = sv('svg', {width: W + 40, height: H + 36, 'class': 'histogram', 'data-total': total, role: 'img'});
  counts.forEach((c, i) => {
    const x0 = lo + i * step, mid = x0 + step / 2, h = H * c / top;
    const r = sv('rect', {'class': 'bar', x: 20 + W * i / bins, y: H - h + 4, width: Math.max(1, W / bins - 1), height: h,
      fill: thr !== null && fires(mid, thr, rule.fires_when) ? '#d9534f' : '#4c72b0', 'data-count': Math.round(c)});
    r.append(sv('title', {}, `${num(x0)} … ${num(x0 + step)}: ${fmt(Math.round(c))} documents`)); svg.append(r);
  });
  const xOf = v => 20 + W * (v - lo) / ((hi - lo) || 1);
  if (thr !== null) svg.append(sv('line', {'class': 'threshold', x1: xOf(thr), x2: xOf(thr), y1: 0, y2: H + 6, stroke: '#000', 'stroke-width': 2}));
  const moved = sv('line', {'class': 'moved', x1: -10, x2: -10, y1: 0, y2: H + 6, stroke: '#e08e00', 'stroke-width': 2, 'stroke-dasharray': '4 3'});
  svg.append(moved);
  svg.append(sv('text', {x: 20, y: H + 24, 'font-size': 11}, num(lo)));
  svg.append(sv('text', {x: W + 20, y: H + 24, 'font-size': 11, 'text-anchor': 'end'}, num(hi)));
  if (thr !== null) svg.append(sv('text', {x: xOf(thr), y: H + 24, 'font-size': 11, 'text-anchor': 'middle'}, 'threshold ' + num(thr)));
  return {svg, xOf, moved};
}

function example(rule, ex, fails, said) {
  fails = fails === undefined ? ex.fired : fails;
  return el('div', {}, el('span', {'class': fails ? 'fired' : 'passed'}, `${said || (fails ? 'fails' : 'passes')}: value ${num(ex.value)}`), ` — ${ex.id} (${ex.source}, ${ex.profile})`,
    highlighted(ex.text || '', ex.spans || []));
}

function whatIf(rule, hist, box) {
  rule.controls.forEach((c, ci) => {
    const values = rule.entries.filter(e => e.path === ci).flatMap(e => e.values);
    if (!values.length) return;
    const lo = Math.min(...values, c.current), hi = Math.max(...values, c.current);
    const step = c.integer ? 1 : ((hi - lo) / 200 || 0.001);
    const wrap = el('div', {'class': 'control', 'data-key': c.key});
    const slider = el('input', {type: 'range', 'class': 'whatif', min: c.integer ? Math.floor(lo) : lo, max: c.integer ? Math.ceil(hi) + 1 : hi + step, step, value: c.current});
    const exact = el('input', {type: 'number', 'class': 'whatif-value', step, value: c.current});
    const out = el('div', {'class': 'predicted'}), cmd = el('code', {'class': 'command'}), flips = el('div', {});
    const now = predict(rule, ci, c.current);
    const update = t => {
      t = c.integer ? Math.round(t) : t;
      const n = predict(rule, ci, t);
      out.setAttribute('data-count', n);
      out.textContent = `at ${num(t)}: ${rule.rule} would remove ${fmt(n)} documents (now ${fmt(now)}; ${n >= now ? '+' : ''}${fmt(n - now)})` +
        (rule.sampled ? ' — estimated from the sample' : '');
      const value = c.n === null ? num(t) : JSON.stringify(c.field.map(([size, limit]) => [size, size === c.n ? +num(t) : limit]));
      cmd.textContent = `hymo rerun ${shq(D.run)} --stage ${rule.stage} --set ${shq(c.key + '=' + value)} --until shards`;
      hist.moved.setAttribute('x1', hist.xOf(t)); hist.moved.setAttribute('x2', hist.xOf(t));
      flips.replaceChildren();
      const changed = rule.examples.filter(ex => c.profiles.includes(ex.profile) && fires(ex.value, t, rule.fires_when) !== fires(ex.value, c.current, rule.fires_when));
      for (const ex of changed.slice(0, 4)) { const now = fires(ex.value, t, rule.fires_when); flips.append(example(rule, ex, now, now ? 'would fail' : 'would pass')); }
    };
    slider.addEventListener('input', () => { exact.value = slider.value; update(+slider.value); });
    exact.addEventListener('input', () => { if (exact.value !== '') { slider.value = exact.value; update(+exact.value); } });
    wrap.append(el('div', {}, `what if ${c.key} (now ${num(c.current)}; profiles: ${c.profiles.join(', ')}) = `, exact), slider, out, cmd, flips);
    box.append(wrap); update(c.current);
  });
}

function rules() {
  const box = $('#rules');
  if (!D.rules.length) { box.append(el('p', {}, 'no stage of this run recorded rule statistics (the quality stage does, from stage version 2)')); return; }
  for (const rule of D.rules) {
    const sec = el('section', {'class': 'rule', 'data-rule': rule.rule, 'data-reached': rule.reached, 'data-removed': rule.removed});
    sec.append(el('h3', {}, `${rule.stage} · ${rule.rule}`));
    sec.append(el('div', {'class': 'note'}, `${fmt(rule.reached)} documents reached it, ${fmt(rule.removed)} removed; fails when value ${rule.fires_when || '?'} threshold` +
      (rule.sampled ? `; distribution from a uniform sample of ${fmt(rule.entries.reduce((a, e) => a + e.values.length, 0))}, scaled` : '; every document') +
      (rule.report_only_profiles.length ? `; report-only (flags, never removes) for profiles ${rule.report_only_profiles.join(', ')}` : '') +
      (/duplicate_\d+(gram|char)_coverage/.test(rule.rule) ? '; under the threshold a value may be the bound that let the rule skip measuring' : '')));
    const hist = histogram(rule);
    sec.append(hist.svg);
    if (rule.threshold !== null) {
      const nearest = side => rule.examples.filter(e => e.fired === side).sort((a, b) => Math.abs(a.value - rule.threshold) - Math.abs(b.value - rule.threshold)).slice(0, 3);
      const cols = el('div', {'class': 'cols'}, el('div', {}, el('b', {}, 'fails the rule: removed, or flagged where report-only (nearest the threshold)'), ...nearest(true).map(e => example(rule, e))),
        el('div', {}, el('b', {}, 'passes the rule (nearest the threshold)'), ...nearest(false).map(e => example(rule, e))));
      sec.append(cols);
    }
    whatIf(rule, hist, sec);
    box.append(sec);
  }
}

function clusters() {
  const box = $('#clusters');
  if (!D.clusters.length) { box.append(el('p', {}, 'no near-duplicate cluster in this run')); return; }
  for (const c of D.clusters) {
    const d = el('details', {'class': 'cluster', 'data-keeper': c.keeper.id}, el('summary', {}, `kept ${c.keeper.id} · ${fmt(c.size)} documents in the cluster`));
    d.append(el('div', {'class': 'doc'}, c.keeper.text || `its text is in a shard this page did not read: hymo audit show ${shq(D.run)} ${shq(c.keeper.id)} --stage dedup_fuzzy`));
    table(d, ['removed member', 'Jaccard', 'matched', 'text'], c.members.map(m => [m.id, m.jaccard === null ? '—' : num(m.jaccard), m.matched_id || '', m.text.slice(0, 120)]));
    box.append(d);
  }
}

function modified() {
  const box = $('#modified');
  if (!D.modified.length) { box.append(el('p', {}, 'no stage of this run modified a document')); return; }
  for (const m of D.modified) {
    box.append(el('div', {'class': 'modified', 'data-rule': m.rule}, el('b', {}, `${m.stage} · ${m.rule}`), ` (${fmt(m.count)} documents) — ${m.id}` +
      (m.offset ? ` from character ${fmt(m.offset)}` : '') + (m.recorded_edits ? '' : ' — this audit row predates recorded edits: ' + m.detail),
      highlighted(m.text, m.spans, 'edit')));
  }
}

function search() {
  const index = new Map();
  D.search.forEach((doc, i) => { for (const key of [doc.id, doc.url, doc.record_id]) if (key) { if (!index.has(key)) index.set(key, []); index.get(key).push(i); } });
  const input = $('#search'), result = $('#search-result');
  const show = () => {
    const key = input.value.trim(), hits = index.get(key) || [];
    result.replaceChildren();
    if (!hits.length) { result.append(el('p', {}, `no document of this page has the id, record id or URL ${JSON.stringify(key)}; ask the run: hymo audit why ${shq(D.run)} ${shq(key)}`)); return; }
    if (hits.length > 1) { result.append(el('p', {}, `${hits.length} documents match; pick one:`));
      for (const i of hits) { const a = el('a', {href: '#'}, D.search[i].id); a.addEventListener('click', ev => { ev.preventDefault(); input.value = D.search[i].id; show(); }); result.append(el('div', {}, a, ` ${D.search[i].file || ''} #${D.search[i].ordinal ?? ''}`)); } return; }
    const doc = D.search[hits[0]], why = doc.why;
    result.append(el('p', {}, el('b', {}, why.id), ': ' + why.final + (doc.url ? ` — ${doc.url}` : '')));
    for (const step of why.stages) {
      result.append(el('div', {}, `${step.stage}: ${step.decision}`));
      for (const e of step.entries) {
        const edits = Array.isArray(e.detail && e.detail.edits) ? e.detail.edits : [];
        result.append(el('div', {'class': 'note'}, `  ${e.action}: ${e.rule}` + (e.value === null ? '' : ` value=${num(e.value)}`) + (e.threshold === null ? '' : ` threshold=${num(e.threshold)}`) +
          ' ' + JSON.stringify(e.detail).slice(0, 300) + (edits.length ? ` (${edits.length} edits${e.detail.edits_total > edits.length ? ' of ' + e.detail.edits_total : ''})` : '')));
      }
    }
    if (D.stale.length) result.append(el('p', {'class': 'warn'}, '! this run has stale stages: they, and the shards after them, still describe the corpus from before an upstream rerun (see the top of the page)'));
    result.append(el('pre', {id: 'why-json'}, JSON.stringify({...why, stale: D.stale}, null, 2)));  // what `audit why --json` prints
  };
  $('#search-go').addEventListener('click', show);
  input.addEventListener('keydown', ev => { if (ev.key === 'Enter') show(); });
}

funnel();
table($('#by-source'), ['source', 'documents in', 'documents out', 'tokens in (≈)', 'tokens out'], D.by_source.map(r => [r.source, fmt(r.docs_in), fmt(r.docs_out), fmt(r.tokens_in), fmt(r.tokens_out)]));
table($('#by-lang'), ['language', 'documents in (after langid)', 'documents out', 'tokens out'], D.by_lang.map(r => [r.lang, fmt(r.docs_in), fmt(r.docs_out), fmt(r.tokens_out)]));
rules(); modified(); clusters(); search();
document.body.setAttribute('data-ready', '1');
"""


def render(data: dict[str, Any]) -> str:
    payload = json.dumps(data, ensure_ascii=False, sort_keys=True, separators=(",", ":")).replace("</", "<\\/")
    bounds = data["bounds"]
    stale = "".join(f'<p class="warn">! {html.escape(line)}</p>' for line in data["stale"])
    run = html.escape(data["run"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>HyMo data report: {run}</title><style>{STYLE}</style></head>
<body>
<h1>HyMo data report</h1>
<p><code>{run}</code> · numbers from its manifests and audit logs; <code>hymo audit summary {run} --json</code> prints the same funnel.</p>
{stale}
<h2>Funnel</h2><div id="funnel"></div>
<h2>Per source and language</h2>
<p class="note">Documents are counted exactly. Tokens out: the mixture's unique tokens (the run's tokenizer). Tokens in: estimated from the
characters of at most the first few ingest shards and each source's characters per token on the tokenizer's sample.</p>
<div class="cols"><div id="by-source"></div><div id="by-lang"></div></div>
<h2>Rules</h2>
<p class="note">Each rule's statistic over the documents that reached it (a document meets the rules in order and leaves at the first it fails).
Bounded at any corpus size: the stage keeps, per rule and source, the documents of the {bounds['sample_per_group']:,} smallest id hashes
(a uniform sample), and counts exactly how many reached the rule; this page shows up to {bounds['values_per_rule']:,} values a rule
({bounds['max_sources'] - 1} sources apart, the rest pooled), scaled to those exact counts. A rule marked "every document" is exact,
and so is its what-if. Moving a threshold shows how many documents that rule would remove; the printed command applies it.</p>
<div id="rules"></div>
<h2>Modified documents</h2>
<p class="note">A few documents of each rule that changed text rather than removing it, as they entered the stage; the audit row's
recorded edits (lines removed, spans masked) are highlighted.</p>
<div id="modified"></div>
<h2>Near-duplicate clusters</h2>
<p class="note">Up to {bounds['max_clusters']} clusters of the fuzzy dedup stage (largest first among its first audit rows): the document kept,
and the removed members with the Jaccard similarity that removed them.</p>
<div id="clusters"></div>
<h2>Why? Search by id, URL or record id</h2>
<p class="note">{html.escape(data['search_note'])}. Shows what <code>hymo audit why</code> shows.</p>
<input id="search" size="60" placeholder="document id, URL or record id"> <button id="search-go">why?</button>
<div id="search-result"></div>
<script type="application/json" id="data">{payload}</script>
<script>{SCRIPT}</script>
</body></html>
"""


def write_data_report(run: str | Path, out: str | Path | None = None) -> Path:
    """RUN/report.html (or `out`), written atomically."""
    from flows.data_report import gather

    target = Path(out) if out else Path(run) / REPORT_FILE
    atomic_write_bytes(target, render(gather(Path(run))).encode("utf-8"))
    return target


PAGE_KEY_FILE = ".report.key"  # beside RUN/report.html: the page_key it was built for


def page_key(run: str | Path, after: frozenset[str] = frozenset()) -> str:
    """What RUN/report.html is a function of: the run's path, every completed stage's manifest (outputs, counts,
    wall times) but those of the stages in `after` (which the flow builds the page beside, as they cannot change
    it), which stages are stale, and HyMo's code. Reading it costs the manifests, not the text."""
    from manifests.digest import canonical_json, sha256_bytes
    from manifests.run_dir import completed_stages
    from manifests.staleness import stale_stages
    from tasks.runner.code_version import code_digest

    run = Path(run).resolve()
    stages = [[stage_dir.path.name, manifest.to_json()] for stage_dir, manifest in completed_stages(run) if stage_dir.stage not in after]
    return sha256_bytes(canonical_json({"run": str(run), "code": code_digest(), "stages": stages,
                                        "stale": [entry.line() for entry in stale_stages(run)]}).encode("utf-8"))


def refresh_data_report(run: str | Path, after: frozenset[str] = frozenset()) -> tuple[Path, bool]:
    """(RUN/report.html, whether it was rebuilt): built once for what the run holds. A flow whose stages were all
    "Cached" (a no-op rerun) leaves the page as it is, instead of reading the run's text again; any stage that
    published since (but those in `after`, see page_key), a stale stage, or other code rebuilds it."""
    target = Path(run) / REPORT_FILE
    key = page_key(run, after)
    try:
        if target.exists() and (Path(run) / PAGE_KEY_FILE).read_text(encoding="utf-8") == key:
            return target, False
    except OSError:
        pass
    write_data_report(run)
    atomic_write_bytes(Path(run) / PAGE_KEY_FILE, key.encode("utf-8"))  # after the page: a crash between leaves a rebuild
    return target, True
