"""The pages of ``litlab report`` (``litlab.site_data`` gathers what they show): the index and one page per card.

Plain HTML with the style inline and one small script on the index (sort by a column, filter by family and
status; ``index.html#family=peft&status=inconclusive&sort=wall`` opens filtered and sorted). Nothing is loaded
from anywhere, so the pages open from ``file://`` offline.
"""

from __future__ import annotations

import re
import statistics
from html import escape

from litlab.card_report import claim_rows, fmt
from litlab.cards import Card
from litlab.claims import ClaimResult, seed_std
from litlab.site_data import CardPage
from litlab.verdicts import wall_time

STYLE = """
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:1400px;padding:0 1em;color:#1f2328}
h1{font-size:1.5em;margin:.2em 0}h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;width:100%;margin:.5em 0}th,td{border:1px solid #d0d7de;padding:4px 6px;vertical-align:top;text-align:left}
th{background:#f6f8fa;position:sticky;top:0}#cards th{cursor:pointer;user-select:none}#cards th[data-dir=asc]::after{content:" ▲"}
#cards th[data-dir=desc]::after{content:" ▼"}code{background:#f6f8fa;padding:0 3px;border-radius:3px;font-size:.92em}
summary{cursor:pointer;color:#0969da}pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:12px}small,.meta{color:#57606a}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;font-size:.9em;white-space:nowrap}
.s-reproduced,.v-pass{background:#dafbe1;color:#1a7f37}.s-not-reproduced,.v-fail{background:#ffebe9;color:#cf222e}
.s-inconclusive{background:#fff8c5;color:#9a6700}.s-not-testable-at-this-scale,.v-unrun,.v-skipped,.v-not-judged{background:#eaeef2;color:#57606a}
.claim{border:1px solid #d0d7de;border-radius:6px;padding:.4em .9em;margin:.8em 0}.claim h3{margin:.3em 0}
blockquote{margin:.4em 0;padding:0 .8em;border-left:3px solid #d0d7de;color:#57606a}.fragile{color:#9a6700;font-weight:600}
img.forest{width:min(100%,860px);display:block;margin:.4em 0}.rerun img{max-width:100%;border:1px solid #d0d7de}
.filters{margin:.6em 0}.filters select{margin-right:1em}#cards{font-size:12.5px}#cards td{max-width:15em}#cards code{overflow-wrap:anywhere}
td.words{min-width:16em;max-width:24em!important;font-size:.92em}#cards td:first-child{min-width:12em}
"""

SCRIPT = """
(function () {
  var table = document.getElementById("cards"), body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
  var family = document.getElementById("family"), status = document.getElementById("status-filter");
  function apply() {
    var shown = 0;
    rows.forEach(function (r) {
      var ok = (!family.value || r.dataset.family === family.value) && (!status.value || r.dataset.status === status.value);
      r.hidden = !ok; if (ok) shown++;
    });
    document.getElementById("shown").textContent = shown + " of " + rows.length + " cards shown";
  }
  function sortBy(th) {
    var i = th.cellIndex, asc = th.dataset.dir !== "asc";
    table.tHead.querySelectorAll("th").forEach(function (h) { delete h.dataset.dir; });
    th.dataset.dir = asc ? "asc" : "desc";
    rows.sort(function (a, b) {
      var x = a.cells[i].dataset.sort, y = b.cells[i].dataset.sort, nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  table.tHead.querySelectorAll("th").forEach(function (th) { th.onclick = function () { sortBy(th); }; });
  var preset = new URLSearchParams(location.hash.slice(1));
  if (preset.get("family")) family.value = preset.get("family");
  if (preset.get("status")) status.value = preset.get("status");
  var key = preset.get("sort"), th = key && table.tHead.querySelector('th[data-key="' + key + '"]');
  if (th) sortBy(th);
  family.onchange = status.onchange = apply;
  apply();
})();
"""


def md(text: str) -> str:
    """A table cell of ``litlab.verdicts`` (Markdown's `code` and <br>) as HTML, everything else escaped."""
    html = re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))
    return html.replace("&lt;br&gt;", "<br>")


def slugged(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def badge(text: str, prefix: str) -> str:
    return f'<span class="badge {prefix}-{slugged(text)}">{escape(text)}</span>'


def shorten(text: str, limit: int = 260) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rsplit(" ", 1)[0] + " …"


def page(title: str, body: str, script: str = "") -> str:
    tail = f"<script>{script}</script>" if script else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>\n<body>\n{body}\n{tail}</body></html>\n"
    )


def cell(html: str, sort: object = "") -> str:
    return f'<td data-sort="{escape(str(sort))}">{html}</td>'


def index_row(p: CardPage) -> str:
    if p.card is None or p.verdict is None:
        return (
            f'<tr data-family="—" data-status="invalid card">{cell(f"<a href={p.slug}.html>{p.slug}</a>", p.slug)}'
            f'<td colspan="9">invalid card: {escape(p.error)}</td></tr>'
        )
    card, v, rec = p.card, p.verdict, p.card.recorded
    arxiv = f" · arXiv {p.arxiv}" if p.arxiv and p.arxiv not in card.venue else ""
    paper = f'<a href="{p.slug}.html">{escape(card.title)}</a><br><small>{escape(card.venue)}{arxiv}</small>'
    words = "<br>".join(
        (f"<code>{escape(c.id)}</code> " if len(card.headlines) > 1 else "") + escape(shorten(c.paper, 200))
        for c in card.headlines
    )
    ratio = next((h.mde / h.paper_effect for h in v.headlines if h.mde and h.paper_effect), float("inf"))
    seeds = rec.get("seeds") or []
    seconds = rec.get("wall_time_s")
    return (
        f'<tr data-family="{escape(p.family)}" data-status="{escape(v.status)}">'
        + cell(paper, card.title.lower())
        + f'<td class="words">{words or "—"}</td>'
        + cell(md(v.headline_text() or "—"), " ".join(h.verdict for h in v.headlines))
        + f'<td data-sort="{escape(v.status)}" title="{escape(v.reason)}">{badge(v.status, "s")}</td>'
        + cell(md(v.control_text()), " ".join(c.verdict for c in v.controls))
        + cell(md(v.mde_text()), ratio)
        + cell(f"{len(seeds)}<br><small>{escape(', '.join(map(str, seeds)))}</small>", len(seeds))
        + cell(escape(wall_time(rec)), seconds if seconds is not None else "")
        + cell(escape(p.authors_check), p.authors_check)
        + cell(f"{escape(str(rec.get('date', '—')))}<br><small>{escape(str(rec.get('scale', '')))}</small>", rec.get("date", ""))
        + "</tr>"
    )  # fmt: skip


INDEX_COLUMNS = (
    ("paper", "paper"),
    ("claim", "headline claim (the paper's words)"),
    ("verdict", "headline verdict: d [95 % CI]"),
    ("status", "status"),
    ("control", "positive control"),
    ("mde", "MDE vs paper effect"),
    ("seeds", "seeds"),
    ("wall", "wall time"),
    ("authors", "authors' code check"),
    ("date", "recorded"),
)


def render_index(pages: list[CardPage]) -> str:
    families = sorted({p.family for p in pages})
    statuses = sorted({p.verdict.status for p in pages if p.verdict})
    options = "".join(f'<option value="{escape(f)}">{escape(f)}</option>' for f in families)
    status_options = "".join(f'<option value="{escape(s)}">{escape(s)}</option>' for s in statuses)
    head = "".join(f'<th data-key="{key}">{escape(label)}</th>' for key, label in INDEX_COLUMNS)
    body = f"""<h1>litlab: where the papers stand</h1>
<p class="meta">{len(pages)} reproduction cards, each judged on its recorded numbers under its current claims
(<code>litlab report</code>; the README's methods table is the same judgement). d is the method's improvement over
the compared run with its 95 % interval; MDE is the minimal detectable effect at the card's seeds (the interval's
half-width plus the margin) next to the effect the paper reports. Click a column to sort.</p>
<div class="filters">family <select id="family"><option value="">all</option>{options}</select>
status <select id="status-filter"><option value="">all</option>{status_options}</select>
<span id="shown"></span></div>
<table id="cards"><thead><tr>{head}</tr></thead><tbody>
{chr(10).join(index_row(p) for p in pages)}
</tbody></table>"""
    return page("litlab: reproduction cards", body, SCRIPT)


def claim_section(p: CardPage, card: Card, claim_id: str, result: ClaimResult | None) -> str:
    claim = next(c for c in card.claims if c.id == claim_id)
    role = "headline" if claim.headline else "positive control" if claim.control else "supporting"
    scale = str(card.recorded.get("scale", "quick"))
    if result is None:
        where = f"scale {', '.join(claim.scales)}" + (
            f", requires {claim.requires}" if claim.requires else ""
        )
        verdict, why = "not judged", f"judged at {where}; recorded at scale {scale}"
    else:
        verdict, why = result.verdict, result.reason
    out = [
        f'<section class="claim" id="claim-{escape(claim.id)}" data-verdict="{escape(verdict)}">',
        f"<h3><code>{escape(claim.id)}</code> {badge(verdict, 'v')} <small>{claim.kind}, {role}</small>"
        + (' <span class="fragile">fragile: flips within the determinism tolerance</span>' if result and result.fragile else "")
        + "</h3>",
    ]  # fmt: skip
    if claim.paper:
        out.append(f"<blockquote>{escape(claim.paper)}</blockquote>")
    if claim_id in p.figures:
        out.append(
            f'<img class="forest" src="{escape(p.figures[claim_id])}" alt="forest plot of {escape(claim_id)}">'
        )
    if result is not None and (result.comparisons or result.kind == "mechanism"):
        heads = ("claim", "kind", "compared", "n", "means ± std", "d [95 % CI]", "needs low end >", "verdict")
        rows = "".join(
            "<tr>" + "".join(f"<td>{escape(x)}</td>" for x in row[2:]) + "</tr>" for row in claim_rows(result)
        )
        out.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in heads[2:]) + f"</tr>{rows}</table>")
    if claim.kind == "mechanism":
        out.append(f"<p>value <code>{escape(claim.value)}</code> {escape(claim.op)} {claim.target:g}"
                   + (f"; fails if: {escape(claim.fails_if)}" if claim.fails_if else "") + "</p>")  # fmt: skip
    if result is not None and result.headline:
        out.append(f"<p>paper's effect {fmt(result.paper_effect)}, minimal detectable effect {fmt(result.mde)}"
                   + (f" — {escape(result.sensitivity)}" if result.sensitivity else "") + "</p>")  # fmt: skip
    if why:
        out.append(f"<p><small>{escape(why)}</small></p>")
    if claim.note:
        out.append(f"<p><em>{escape(claim.note.strip())}</em></p>")
    return "\n".join(out + ["</section>"])


def runs_table(p: CardPage, card: Card) -> str:
    rows = []
    for name, spec in card.runs.items():
        recorded = p.values.get(name) or {}
        numbers = "<br>".join(
            f"{escape(m)}: {fmt(statistics.fmean(xs.values()))}"
            + (f" ± {fmt(seed_std(xs.values()))}" if len(xs) > 1 else "")
            + f" <small>({', '.join(fmt(x) for x in xs.values())})</small>"
            for m, xs in recorded.items()
            if xs
        )
        rows.append(
            f"<tr><td><code>{escape(name)}</code></td><td>{escape(spec.role)}</td><td>{escape(spec.setting)}</td>"
            f"<td>{escape(', '.join(spec.scales))}</td><td>{escape(' '.join(spec.description.split()))}</td>"
            f"<td>{numbers or '—'}</td></tr>"
        )
    head = "<tr><th>run</th><th>role</th><th>setting</th><th>scales</th><th>what it is</th><th>recorded: mean ± std (per seed)</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"


def rerun_section(p: CardPage) -> str:
    if p.rerun is None:
        return (
            "<p>Not re-run on this machine (no <code>runs/repro/"
            + escape(p.slug)
            + "/results.json</code>).</p>"
        )
    r = p.rerun
    then = "" if r.status == "not run" else f" (status then: {escape(r.status)})"
    matched = {
        True: "matched the recorded numbers",
        False: "moved from the recorded numbers",
        None: "not compared",
    }
    figures = "".join(
        f'<figure><img src="{escape(p.slug)}/rerun/{escape(f.name)}" alt="{escape(f.stem)}">'
        f"<figcaption>{escape(f.name)} (re-run here, {escape(r.date)})</figcaption></figure>"
        for f in r.figures
    )
    return (
        f'<div class="rerun"><p><strong>Re-run here</strong> on {escape(r.date)} at scale {escape(r.scale)}'
        f"{then}: {matched[r.matched]} — {escape(r.detail)}.</p>{figures}</div>"
    )


def render_card(p: CardPage) -> str:
    card, v = p.card, p.verdict
    if card is None or v is None:
        body = f'<nav><a href="index.html">← all cards</a></nav><h1>{escape(p.slug)}</h1><p>invalid card: {escape(p.error)}</p>'
        return page(p.slug, body)
    rec = card.recorded
    results = {r.id: r for r in p.results}
    claims = "\n".join(claim_section(p, card, c.id, results.get(c.id)) for c in card.claims)
    controls = "".join(
        f'<li><a href="#claim-{escape(c.id)}"><code>{escape(c.id)}</code></a> {badge(results[c.id].verdict if c.id in results else "not judged", "v")}</li>'
        for c in card.controls
    ) or "<li>none at this scale</li>"  # fmt: skip
    amendments = "".join(
        f"<tr><td>{escape(a.date)}</td><td>{escape(a.changed)}</td><td>{escape(a.why)}</td><td>{escape(a.old)}</td></tr>"
        for a in card.amendments
    )  # fmt: skip
    commands = "".join(
        f"<li>{escape(s)} ({len(seeds)} seeds): <code>litlab repro {escape(card.slug)}"
        + ("" if s == "quick" else f" --scale {escape(s)}") + "</code></li>"
        for s, seeds in card.seeds.items()
    )  # fmt: skip
    plans = "".join(
        f"<h3>{escape(s)} scale</h3><pre>{escape(text)}</pre>" for s, text in reversed(p.plans.items())
    )
    arxiv = f" · arXiv {escape(p.arxiv)}" if p.arxiv and p.arxiv not in card.venue else ""
    n_claims = len(card.claims)
    body = f"""<nav><a href="index.html">← all cards</a></nav>
<h1>{escape(card.title)}</h1>
<p class="meta">{escape(card.venue)}{arxiv} · family {escape(p.family)} · card <code>seeds/{escape(card.slug)}.yaml</code>
· recorded {escape(str(rec.get("date", "—")))} at scale {escape(str(rec.get("scale", "—")))}, seeds {escape(str(rec.get("seeds", "—")))},
wall time {escape(wall_time(rec))} · authors' code check: {escape(p.authors_check)}</p>
<p>Status: <span id="status" class="badge s-{slugged(v.status)}">{escape(v.status)}</span> <small>{escape(v.reason)}</small></p>
<p><strong>The paper's claim.</strong> {escape(card.claim)}</p>
<details><summary>The card's note on this status (numbers, limits, cost)</summary><p>{escape(" ".join(card.status_note.split()))}</p></details>
<h2>Claims (<span id="claim-count">{n_claims}</span>)</h2>
<p class="meta">Each comparison: d, the method's improvement (&gt; 0 = better), with its 95 % interval
({"paired over seeds" if card.pairing == "seed" else "Welch"}); the black tick is what the interval's low end must clear
(the margin; minus the margin for a parity claim), the dotted line the paper's effect, grey points the seeds.</p>
{claims}
<h2>Positive controls</h2><ul>{controls}</ul>
<h2>Runs and their roles</h2>{runs_table(p, card)}
<h2>Amendments ({len(card.amendments)})</h2>
<table><tr><th>date</th><th>changed</th><th>why</th><th>before</th></tr>{amendments}</table>
<h2>Re-run here</h2>{rerun_section(p)}
<h2>Reproduce</h2><ul>{commands}<li>recorded with: <code>{escape(str(rec.get("command", "—")))}</code></li></ul>
<p class="meta">The plans (<code>litlab repro {escape(card.slug)} --scale &lt;scale&gt; --plan</code>):</p>{plans}
<h2>The paper's numbers</h2><pre>{escape(card.paper_numbers.strip())}</pre>"""
    return page(f"{card.title} — litlab", body)
