"""The run report's audited-samples section: every sample of samples.jsonl as a row of token spans
that carry their advantage, behaviour, trainer and reference logprobs as data attributes, and the
script (PAINT) that colours them by the quantity picked in the page's selector. report.render
places both; kept apart because it is the page's one interactive view, with its own JavaScript."""

from __future__ import annotations

import html


def _token_spans(row: dict) -> str:
    spans = []
    for j, t in enumerate(row.get("response_tokens") or list(row.get("response", ""))):
        data = {
            name: row[key][j]
            for name, key in (
                ("adv", "advantages"),
                ("lp", "behaviour_logprobs"),
                ("tlp", "trainer_logprobs"),
                ("ref", "ref_logprobs"),
            )
            if row.get(key) is not None and j < len(row[key])
        }
        attrs = " ".join(f'data-{k}="{v}"' for k, v in data.items())
        title = html.escape(" ".join(f"{k}={v}" for k, v in data.items()), quote=True)
        spans.append(f'<span class="tok" {attrs} title="{title}">{html.escape(t.replace(chr(10), "⏎"))}</span>')
    return "".join(spans)


def samples_html(rows: list[dict]) -> str:
    if not rows:
        return "<p>No audited samples (samples.jsonl is written by RL runs at each evaluation).</p>"
    parts = [
        '<p>Colour tokens by <select id="colour" onchange="paint(this.value)">'
        '<option value="adv">advantage</option><option value="lp">behaviour logprob</option>'
        '<option value="mis">trainer − behaviour logprob</option>'
        '<option value="kl">behaviour − reference logprob</option>'
        "</select> (green = positive/likely, red = negative/unlikely; hover a token for its numbers)</p>"
    ]
    steps = sorted({r.get("step", 0) for r in rows})
    for step in steps:  # one fold per evaluation, the last one open
        parts.append(f"<details{' open' if step == steps[-1] else ''}><summary>step {step}</summary>")
        parts.extend(_sample(r) for r in rows if r.get("step", 0) == step)
        parts.append("</details>")
    return "".join(parts)


def _sample(r: dict) -> str:
    comps = html.escape(", ".join(f"{k}={v}" for k, v in (r.get("components") or {}).items()))
    error = f" · error {html.escape(str(r['error']))}" if r.get("error") else ""
    return (
        f'<div class="sample"><div class="meta">step {r.get("step")} · {r.get("selection", "")} · '
        f"reward {r.get('reward')} ({comps}) · advantage {r.get('advantage')} · policy v{r.get('policy_version')} · "
        f"finish {r.get('finish_reason')}{error}</div>"
        f'<code class="prompt">{html.escape(r.get("prompt", ""))}</code> <code>{_token_spans(r)}</code></div>'
    )


PAINT = """
function paint(mode) {
  var toks = document.querySelectorAll('.tok'); var vals = [];
  toks.forEach(function(t) {
    var d = t.dataset, v = null;
    if (mode === 'adv' && d.adv !== undefined) v = +d.adv;
    if (mode === 'lp' && d.lp !== undefined) v = +d.lp;
    if (mode === 'mis' && d.tlp !== undefined) v = d.tlp - d.lp;
    if (mode === 'kl' && d.ref !== undefined) v = d.lp - d.ref;
    vals.push(v);
  });
  var scale = Math.max(1e-9, Math.max.apply(null, vals.map(function(v) { return v === null ? 0 : Math.abs(v); })));
  toks.forEach(function(t, i) {
    var v = vals[i];
    if (v === null) { t.style.background = ''; return; }
    var a = Math.min(1, Math.abs(v) / scale);
    t.style.background = v >= 0 ? 'rgba(40,160,60,' + a + ')' : 'rgba(210,50,40,' + a + ')';
    if (mode === 'lp') t.style.background = 'rgba(210,50,40,' + Math.min(1, -v / 5) + ')';
  });
}
paint('adv');
"""
