"""What the Chromium tests measure on a rendered lessons page (JavaScript run in the page).

FIGURE_CHECK reads the boxes plotly drew for one widget's figure (the title, each axis title, the
tick labels of each axis, the legend, colorbars) and returns the pairs that overlap, the tick labels
of one axis that overlap each other, any box that shares the legend's band, and any box that runs
out of the figure (a clipped right axis, a title cut at the top). TEXT_CHECK returns the elements
whose text overflows their box, and a page that scrolls sideways. MATH_CHECK returns the formulas
KaTeX did not typeset.
"""

FIGURE_CHECK = r"""
(el) => {
  const plot = el.classList.contains('plot') ? el : el.querySelector('.plot');  // a widget, or a report's plot
  if (!plot.querySelector('svg.main-svg')) return ['no figure drawn'];
  const frame = plot.getBoundingClientRect();
  const box = (n) => { const r = n.getBoundingClientRect();
    return r.width * r.height > 0 ? {x0: r.left, y0: r.top, x1: r.right, y1: r.bottom} : null; };
  const parts = [], ticks = {};
  const add = (name, kind, b) => { if (b) parts.push({name, kind, ...b}); };
  plot.querySelectorAll('.g-gtitle text').forEach(t => add('the title', 'title', box(t)));
  plot.querySelectorAll('[class^="g-"][class$="title"] text').forEach(t => {
    const cls = t.parentNode.getAttribute('class');
    if (cls !== 'g-gtitle') add(cls.slice(2, -5) + ' axis title', 'axis-title', box(t)); });
  plot.querySelectorAll('g.legend').forEach(l => add('the legend', 'legend', box(l.querySelector('rect.bg') || l)));
  plot.querySelectorAll('g.colorbar').forEach(c => add('a colorbar', 'colorbar', box(c)));
  plot.querySelectorAll('g[class$="tick"] text').forEach(t => {
    const axis = t.closest('g[class$="tick"]').getAttribute('class').slice(0, -4);
    (ticks[axis] = ticks[axis] || []).push(box(t)); });
  const cross = (a, b) => Math.min(a.x1, b.x1) - Math.max(a.x0, b.x0) > 1 && Math.min(a.y1, b.y1) - Math.max(a.y0, b.y0) > 1;
  const problems = [];
  Object.keys(ticks).forEach(axis => {
    const bs = ticks[axis].filter(Boolean);
    if (!bs.length) return;
    add(axis + ' tick labels', 'ticks', bs.reduce((a, b) => ({x0: Math.min(a.x0, b.x0), y0: Math.min(a.y0, b.y0),
                                                              x1: Math.max(a.x1, b.x1), y1: Math.max(a.y1, b.y1)})));
    let crowded = false;
    for (let i = 0; i < bs.length; i++) for (let j = i + 1; j < bs.length; j++) crowded = crowded || cross(bs[i], bs[j]);
    if (crowded) problems.push(`${axis} tick labels overlap each other`);
  });
  for (let i = 0; i < parts.length; i++) {
    const a = parts[i];
    if (a.x0 < frame.left - 1 || a.x1 > frame.right + 1 || a.y0 < frame.top - 1 || a.y1 > frame.bottom + 1)
      problems.push(`${a.name} runs out of the figure`);
    for (let j = i + 1; j < parts.length; j++) {
      const b = parts[j];
      if (a.kind === 'ticks' && b.kind === 'ticks') continue;        // x and y labels may meet at the corner
      const legend = a.kind === 'legend' || b.kind === 'legend';
      if (legend ? Math.min(a.y1, b.y1) - Math.max(a.y0, b.y0) > 1 : cross(a, b))
        problems.push(`${a.name} overlaps ${b.name}`);
    }
  }
  return problems;
}
"""

TEXT_CHECK = r"""
() => {
  const out = [], root = document.documentElement, vw = root.clientWidth;
  if (root.scrollWidth > vw + 1) out.push(`the page scrolls sideways (${root.scrollWidth}px in ${vw}px)`);
  const scrolls = 'pre, .table-wrap, .math.display, .diagram-wrap, .plot, svg, table.source, .katex, #search-results';
  const name = (el) => el.tagName.toLowerCase() + (el.className && typeof el.className === 'string' ? '.' + el.className.split(' ')[0] : '')
    + ' "' + (el.textContent || '').trim().slice(0, 40) + '"';
  for (const el of document.querySelectorAll('body *')) {
    if (el.closest(scrolls) || /^(INPUT|SELECT|OPTION|BUTTON|SCRIPT|STYLE|BR)$/.test(el.tagName)) continue;
    const cs = getComputedStyle(el);
    if (cs.display === 'inline' || cs.display === 'none' || cs.display === 'contents' || cs.overflowX !== 'visible') continue;
    if (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1)
      out.push(`${name(el)} overflows its box (${el.scrollWidth}px > ${el.clientWidth}px)`);
  }
  return out.slice(0, 8);
}
"""

MATH_CHECK = r"""
() => [...document.querySelectorAll('.math')].filter(m => !m.querySelector('.katex') || m.querySelector('.katex-error'))
        .map(m => m.textContent.slice(0, 60))
"""
