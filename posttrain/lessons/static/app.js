// posttrain lessons: builds each widget's knobs from its JSON spec, asks the server (or the
// precomputed data of a static export) for the widget's result, and draws it with plotly; typesets
// the text's math with the vendored KaTeX; the sidebar and the search box.
(function () {
  "use strict";
  var PT = window.PT = window.PT || {data: {}, static: false, api: "api/", root: ""};
  var STORE = "posttrain-lessons-done";
  var PHONE = 600;               // px of plot width under which figures take their compact layout

  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) { return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]; });
  }
  function key(spec, state) {  // the same text as Widget.key in registry.py
    return spec.knobs.map(function (k) { return k.name + "=" + state[k.name]; }).join("&");
  }
  function result(spec, state) {
    if (PT.static) {
      var d = PT.data[spec.name], k = key(spec, state);
      if (!d || !(k in d)) return Promise.reject(new Error("no precomputed data for " + spec.name + " at " + k));
      return Promise.resolve(d[k]);
    }
    var q = spec.knobs.map(function (k) { return k.name + "=" + encodeURIComponent(state[k.name]); }).join("&");
    return fetch(PT.api + spec.name + "?" + q).then(function (res) {
      return res.json().then(function (body) {
        if (!res.ok) throw new Error(body.error || res.statusText);
        return body;
      });
    });
  }

  // ---- the shared figure layer: every widget's layout goes through here ---------------------------
  // Axis titles, tick labels, the title and the legend each get their own room: plotly's automargin
  // grows the margins to fit tick labels and axis titles (a right axis included), the title sits in
  // the top margin, and the legend is laid out horizontally at the bottom of the figure (container
  // coordinates), below the x-axis title, with the bottom margin grown to hold it.
  function wrap(text, chars) {  // plotly never wraps a label: break long ones at spaces into <br> lines
    if (typeof text !== "string" || text.length <= chars || text.indexOf("<br") >= 0) return text;
    var lines = [""];
    text.split(" ").forEach(function (w) {
      var cur = lines[lines.length - 1];
      if (cur && (cur + " " + w).length > chars) lines.push(w); else lines[lines.length - 1] = cur ? cur + " " + w : w;
    });
    return lines.join("<br>");
  }

  function tidy(layout, data, width) {
    var out = JSON.parse(JSON.stringify(layout || {}));
    var narrow = width < PHONE, font = narrow ? 11 : 12;
    var perLine = function (px, size) { return Math.max(12, Math.floor(px / (0.56 * size))); };
    out.autosize = true;
    out.font = Object.assign({size: font}, out.font || {});
    out.separators = out.separators || ".,";
    var title = out.title;
    if (typeof title === "string") title = {text: title};
    if (title && title.text) {
      out.title = Object.assign({}, title, {x: 0, xref: "container", xanchor: "left", y: 1, yref: "paper",
        yanchor: "bottom", pad: {b: 12, l: 4}, automargin: true, text: wrap(title.text, perLine(width - 16, narrow ? 13 : 14)),
        font: Object.assign({}, title.font || {}, {size: narrow ? 13 : 14})});
    }
    Object.keys(out).forEach(function (k) {
      if (!/^[xy]axis\d*$/.test(k)) return;
      var ax = out[k] = Object.assign({}, out[k]);
      ax.automargin = true;
      if (typeof ax.title === "string") ax.title = {text: ax.title};
      if (ax.title) ax.title = Object.assign({standoff: 6}, ax.title,
        {text: wrap(ax.title.text, perLine(k.charAt(0) === "x" ? width * 0.8 : (out.height || 340) * 0.7, font))});
      if (!ax.hoverformat && ax.type !== "category" && ax.type !== "date") ax.hoverformat = ".4~g";
      if (narrow) ax.tickfont = Object.assign({size: 10}, ax.tickfont || {});
      if (ax.type === "log" && ax.dtick == null && decades(data, k) <= 4) ax.dtick = "D2";   // 2 and 5, not 2…9
    });
    wrapCategories(out, data, width, narrow ? 10 : font);
    var named = (data || []).filter(function (t) { return t.name && t.showlegend !== false; }).length;
    (data || []).forEach(function (t) { if (t.name) t.name = wrap(t.name, perLine(width * 0.8, narrow ? 10 : 11)); });
    if (out.showlegend !== false && named > 1 || out.showlegend === true) {
      out.legend = Object.assign({}, out.legend || {}, {orientation: "h", x: 0, xanchor: "left", xref: "container",
        y: 0, yanchor: "bottom", yref: "container", font: {size: narrow ? 10 : 11}});
    }
    if (narrow) stack(out, data);
    var m = out.margin || {};
    out.margin = {l: narrow ? 8 : Math.min(m.l || 12, 12), r: narrow ? 8 : Math.min(m.r || 12, 12),
                  t: m.t != null ? Math.min(m.t, 40) : 40, b: 8, pad: 2};
    (data || []).forEach(function (t) {
      if (t.type === "heatmap" && t.colorbar !== false) {
        t.colorbar = Object.assign({thickness: narrow ? 10 : 14, outlinewidth: 0}, t.colorbar || {});
      }
    });
    return out;
  }

  function decades(data, k) {  // the span of the data drawn against axis k, in powers of ten
    var id = k.charAt(0) + k.slice(5), lo = Infinity, hi = -Infinity;
    (data || []).forEach(function (t) {
      if ((t[k.charAt(0) + "axis"] || k.charAt(0)) !== id || !Array.isArray(t[k.charAt(0)])) return;
      t[k.charAt(0)].forEach(function (v) { if (typeof v === "number" && v > 0) { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
    });
    return hi > 0 ? Math.log10(hi / lo) : 0;
  }

  // Long category labels (bars named by words) are wrapped onto lines instead of being rotated,
  // which costs less height and never runs out of the figure.
  function wrapCategories(out, data, width, size) {
    var cats = {};
    (data || []).forEach(function (t) {
      if (!Array.isArray(t.x) || typeof t.x[0] !== "string" || t.orientation === "h") return;
      var a = t.xaxis || "x";
      cats[a] = cats[a] || [];
      t.x.forEach(function (c) { if (typeof c === "string" && cats[a].indexOf(c) < 0) cats[a].push(c); });
    });
    var g = out.grid, cols = g && g.columns > 1 ? g.columns : 1;
    Object.keys(cats).forEach(function (a) {
      var k = "xaxis" + a.slice(1), ax = out[k] = Object.assign({}, out[k] || {});
      if (ax.tickvals || ax.visible === false) return;
      var dom = ax.domain || [0, 1 / cols], px = (width - 90) * (dom[1] - dom[0]) / cats[a].length;
      var chars = Math.floor(px / (0.58 * size)), longest = function (f) {
        return Math.max.apply(null, cats[a].map(function (c) { return f(c).length; })); };
      if (longest(function (c) { return c; }) <= chars) return;
      ax.tickmode = "array"; ax.tickvals = cats[a];
      if (longest(function (c) { return c.split(" ").reduce(function (x, w) { return w.length > x.length ? w : x; }, ""); }) <= chars) {
        ax.tickangle = 0;                          // every word fits the slot: lines of words
        ax.ticktext = cats[a].map(function (c) { return wrap(c, chars); });
      } else {
        ax.tickangle = -90;                        // a word wider than its slot: labels stand upright
        ax.ticktext = cats[a].map(function (c) { return wrap(c, 22); });
      }
    });
  }

  // Side-by-side subplots (x axes with their own domains) are too narrow on a phone: stack them,
  // one row per x axis, each y axis drawn against it taking that row's height.
  function stack(out, data) {
    var xs = Object.keys(out).filter(function (k) { return /^xaxis\d*$/.test(k) && out[k].domain; });
    var g = out.grid;
    if (xs.length < 2 && g && g.rows === 1 && g.columns > 1) {   // a plotly grid: turn its columns into rows
      out.grid = Object.assign({}, g, {rows: g.columns, columns: 1, roworder: "top to bottom", ygap: 0.35});
      out.height = Math.round((out.height || 340) * (0.5 + 0.55 * g.columns));
      return;
    }
    if (xs.length < 2) return;
    var id = function (k) { return k.charAt(0) + k.slice(5); };           // "xaxis2" → "x2", "yaxis" → "y"
    var key = function (i) { return i.charAt(0) + "axis" + i.slice(1); };  // "y3" → "yaxis3"
    var top = function (k) {                        // a panel drawn under others (its y domain lower) stays under them
      var y = out[k].anchor && out[key(out[k].anchor)];
      return y && y.domain ? y.domain[1] : 1;
    };
    xs.sort(function (a, b) { return top(b) - top(a) || out[a].domain[0] - out[b].domain[0]; });
    var n = xs.length, height = Math.round((out.height || 340) * (0.5 + 0.55 * n)), gap = 90 / height;
    var ys = {};                                   // x axis id → the y axes its traces use
    (data || []).forEach(function (t) {
      var x = t.xaxis || "x", y = t.yaxis || "y", yk = key(y);
      if (out[yk] && out[yk].overlaying) return;   // follows the axis it overlays
      (ys[x] = ys[x] || {})[y] = true;
    });
    xs.forEach(function (xk, i) {
      var dom = [1 - (i + 1) / n + (i < n - 1 ? gap / 2 : 0), 1 - i / n - (i > 0 ? gap / 2 : 0)];
      out[xk] = Object.assign({}, out[xk], {domain: [0, 1]});
      Object.keys(ys[id(xk)] || {}).forEach(function (y) {
        out[key(y)] = Object.assign({}, out[key(y)] || {}, {domain: dom, anchor: id(xk)});
        out[xk].anchor = y;
      });
    });
    (data || []).forEach(function (t) {            // a colorbar spans its own row, not the whole figure
      var dom = (out[key(t.yaxis || "y")] || {}).domain;
      if (t.type === "heatmap" && dom) t.colorbar = Object.assign({}, t.colorbar || {}, {y: (dom[0] + dom[1]) / 2, yanchor: "middle", len: dom[1] - dom[0]});
    });
    delete out.grid;
    out.height = height;
  }

  // After a draw: text that runs out of the figure, and a legend that overlaps the axes' labels.
  // Plotly's automargin sizes each margin for its largest pusher, not for the legend and the x
  // axis together, and gives up when the figure is too small; here the margins and the height
  // grow by what was measured, and the figure is drawn again (a few rounds at most).
  function measure(plot) {
    var f = plot.getBoundingClientRect(), o = {t: 0, b: 0, l: 0, r: 0, clash: 0};
    var legend = plot.querySelector("g.legend"), lb = legend && legend.getBoundingClientRect();
    plot.querySelectorAll("svg text").forEach(function (t) {
      var r = t.getBoundingClientRect();
      if (!r.width || !r.height) return;
      o.t = Math.max(o.t, f.top - r.top); o.b = Math.max(o.b, r.bottom - f.bottom);
      o.l = Math.max(o.l, f.left - r.left); o.r = Math.max(o.r, r.right - f.right);
      if (lb && lb.height && !legend.contains(t) && r.bottom > lb.top && r.top < lb.bottom)   // the legend's own band
        o.clash = Math.max(o.clash, r.bottom - lb.top);
    });
    // y-axis labels of neighbouring subplots that run into each other (a right axis in the gap)
    var ys = [];
    plot.querySelectorAll('[class^="g-y"][class$="title"] text, g[class^="y"][class$="tick"] text').forEach(function (t) {
      var g = t.closest('[class^="g-y"], g[class^="y"]'), r = t.getBoundingClientRect();
      if (r.width && r.height) ys.push({axis: g.getAttribute("class").replace(/^g-/, "").replace(/(title|tick)$/, ""), r: r});
    });
    o.gap = 0;
    ys.forEach(function (a) {
      ys.forEach(function (b) {
        if (a.axis >= b.axis || a.r.bottom <= b.r.top || b.r.bottom <= a.r.top) return;
        o.gap = Math.max(o.gap, Math.min(a.r.right, b.r.right) - Math.max(a.r.left, b.r.left));
      });
    });
    return o;
  }

  function widen(layout, px, plotWidth) {  // more room between side-by-side subplots
    var d = (px + 10) / Math.max(plotWidth, 1);
    if (layout.grid && layout.grid.columns > 1) {
      layout.grid.xgap = Math.min(0.6, (layout.grid.xgap || 0.2) + d * layout.grid.columns);
      return true;
    }
    var xs = Object.keys(layout).filter(function (k) { return /^xaxis\d*$/.test(k) && layout[k].domain; });
    xs.sort(function (a, b) { return layout[a].domain[0] - layout[b].domain[0]; });
    if (xs.length < 2 || layout[xs[0]].domain[1] > layout[xs[1]].domain[0]) return false;   // stacked, not side by side
    for (var i = 0; i + 1 < xs.length; i++) {
      layout[xs[i]].domain = [layout[xs[i]].domain[0], layout[xs[i]].domain[1] - d / 2];
      layout[xs[i + 1]].domain = [layout[xs[i + 1]].domain[0] + d / 2, layout[xs[i + 1]].domain[1]];
    }
    return true;
  }

  function fit(plot, data, layout, config, rounds) {
    var o = measure(plot), size = plot._fullLayout && plot._fullLayout._size;
    if (!rounds || !size) return null;
    var gap = o.gap > 1 && widen(layout, o.gap, size.w);
    if (Math.max(o.t, o.b, o.l, o.r) <= 1 && o.clash <= 0 && !gap) return null;
    if (o.clash > 0 || o.b > 1) layout.margin.b = Math.ceil(size.b + Math.max(o.clash, 0) + Math.max(o.b, 0) + 6);
    if (o.t + o.b > 1) layout.height = (layout.height || 340) + Math.ceil(o.t + o.b) + 6;
    if (o.t > 1) layout.margin.t = Math.ceil(size.t + o.t + 2);
    if (o.l > 1) layout.margin.l = Math.ceil(size.l + o.l + 2);
    if (o.r > 1) layout.margin.r = Math.ceil(size.r + o.r + 2);
    return Plotly.react(plot, data, layout, config).then(function () { return fit(plot, data, layout, config, rounds - 1); });
  }

  function control(k, state, changed) {
    var wrap = document.createElement("label");
    wrap.className = "knob knob-" + k.kind;
    wrap.innerHTML = "<span>" + esc(k.label) + "</span>";
    var input, shown = document.createElement("output");
    if (k.kind === "select") {
      input = document.createElement("select");
      k.values.forEach(function (v) {
        var o = document.createElement("option"); o.value = v; o.textContent = v; input.appendChild(o);
      });
      input.value = state[k.name];
      input.addEventListener("change", function () { state[k.name] = input.value; changed(); });
    } else if (k.kind === "check") {
      input = document.createElement("input"); input.type = "checkbox";
      input.checked = state[k.name] === "true";
      input.addEventListener("change", function () { state[k.name] = input.checked ? "true" : "false"; changed(); });
    } else {
      input = document.createElement("input"); input.type = "range";
      input.min = 0; input.max = k.values.length - 1; input.step = 1;
      input.value = k.values.indexOf(state[k.name]);
      shown.textContent = state[k.name];
      input.addEventListener("input", function () {
        state[k.name] = k.values[+input.value]; shown.textContent = state[k.name]; changed();
      });
    }
    input.dataset.knob = k.name;
    wrap.appendChild(input);
    if (k.kind === "range") wrap.appendChild(shown);
    wrap.sync = function () {  // reflect state into the control (the "try it" button)
      if (k.kind === "check") input.checked = state[k.name] === "true";
      else if (k.kind === "select") input.value = state[k.name];
      else { input.value = k.values.indexOf(state[k.name]); shown.textContent = state[k.name]; }
    };
    return wrap;
  }

  function build(el) {
    var spec = JSON.parse(el.querySelector('script[type="application/json"]').textContent);
    var state = {};
    spec.knobs.forEach(function (k) { state[k.name] = k.default; });
    var plot = el.querySelector(".plot"), kpis = el.querySelector(".kpis");
    var note = el.querySelector(".note"), err = el.querySelector(".error"), seq = 0, last = null;
    function draw(out) {
      var data = JSON.parse(JSON.stringify(out.figure.data));   // tidy rewrites names and colorbars; keep `out` intact
      var layout = tidy(out.figure.layout, data, plot.clientWidth || 800), config = {displayModeBar: false, responsive: true};
      return Plotly.react(plot, data, layout, config).then(function () { return fit(plot, data, layout, config, 3); });
    }
    function update() {
      var mine = ++seq;
      el.dataset.busy = "1";
      result(spec, state).then(function (out) {
        if (mine !== seq) return;
        last = out;
        return draw(out).then(function () {
          kpis.innerHTML = out.kpis.map(function (kv) {
            return '<div class="kpi"><span>' + esc(kv[0]) + "</span><b>" + esc(kv[1]) + "</b></div>";
          }).join("");
          note.textContent = out.note || "";
          plot.setAttribute("aria-label", spec.title + (out.note ? ". " + out.note : ""));
          err.textContent = "";
          el.dataset.rev = String((+el.dataset.rev || 0) + 1);
        });
      }).catch(function (e) {
        err.textContent = "error: " + e.message;
        console.error("widget " + spec.name + ": " + e.message);
      }).then(function () { if (mine === seq) el.dataset.busy = "0"; });
    }
    var ctr = el.querySelector(".controls"), wraps = [];
    spec.knobs.forEach(function (k) { var w = control(k, state, update); wraps.push(w); ctr.appendChild(w); });
    el.ptReset = function () {  // knobs back to their defaults (the reset button; tests call it alone)
      spec.knobs.forEach(function (k) { state[k.name] = k.default; });
      wraps.forEach(function (w) { w.sync(); });
    };
    el.ptRedraw = function () { if (last) draw(last); };  // the width class changed (phone ↔ desktop)
    el.querySelector(".reset-knobs").addEventListener("click", function () { el.ptReset(); update(); });
    el.querySelector(".apply-break").addEventListener("click", function () {
      Object.keys(spec.breaks.knobs).forEach(function (n) { state[n] = spec.breaks.knobs[n]; });
      wraps.forEach(function (w) { w.sync(); });
      update();
    });
    update();
  }

  function progress() {
    var done = {};
    try { done = JSON.parse(localStorage.getItem(STORE) || "{}"); } catch (e) { done = {}; }
    function save() { localStorage.setItem(STORE, JSON.stringify(done)); }
    document.querySelectorAll(".lesson-done").forEach(function (box) {
      box.checked = !!done[box.dataset.lesson];
      box.addEventListener("change", function () {
        if (box.checked) done[box.dataset.lesson] = Date.now(); else delete done[box.dataset.lesson];
        save();
      });
    });
    var n = 0;
    document.querySelectorAll("main li[data-lesson]").forEach(function (li) {
      if (done[li.dataset.lesson]) { li.classList.add("done"); n++; }
    });
    document.querySelectorAll(".sidebar li[data-lesson]").forEach(function (li) {
      if (done[li.dataset.lesson]) li.classList.add("done");
    });
    var count = document.getElementById("progress-count");
    if (count) count.textContent = n;
    var reset = document.getElementById("progress-reset");
    if (reset) reset.addEventListener("click", function () { localStorage.removeItem(STORE); location.reload(); });
  }

  function highlightSource() {  // source pages: #L10-L20 marks that range
    var m = /^#L(\d+)(?:-L(\d+))?$/.exec(location.hash);
    if (!m) return;
    var a = +m[1], b = +(m[2] || m[1]);
    for (var i = a; i <= b; i++) { var row = document.getElementById("L" + i); if (row) row.classList.add("hl"); }
    var first = document.getElementById("L" + a);
    if (first) first.scrollIntoView({block: "center"});
  }

  function sidebar() {  // open on a wide screen, a "Contents" button on a phone; the current lesson in view
    var box = document.querySelector(".toc-box");
    if (!box) return;
    if (window.matchMedia("(min-width: 900px)").matches) box.open = true;
    var cur = box.querySelector(".current");
    var nav = document.querySelector(".sidebar");
    if (cur && box.open) nav.scrollTop = Math.max(0, cur.offsetTop - nav.clientHeight / 3);
  }

  function math() {  // \( \) and \[ \] spans written by the renderer; a TeX error is a console error
    if (!window.renderMathInElement) return;
    document.querySelectorAll("main .math, main .glossary dd").forEach(function (el) {
      window.renderMathInElement(el, {delimiters: [{left: "\\[", right: "\\]", display: true},
                                                    {left: "\\(", right: "\\)", display: false}],
        throwOnError: true, errorCallback: function (msg, e) { console.error("KaTeX: " + msg + " " + e); }});
    });
  }

  // ---- search: the index (search-index.js) is loaded the first time the box is used -------------
  function search() {
    var box = document.getElementById("search"), list = document.getElementById("search-results");
    if (!box) return;
    var loading = false, then = function () {};
    function load(next) {             // run `next` once the index is there (the latest caller wins)
      if (PT.searchIndex) return next();
      then = next;
      if (loading) return;
      loading = true;
      var s = document.createElement("script");
      s.src = PT.root + "search-index.js";
      s.onload = function () { then(); };
      document.head.appendChild(s);
    }
    function snippet(text, term) {
      var i = text.toLowerCase().indexOf(term), a = Math.max(0, i - 60);
      var cut = text.slice(a, a + 160);
      var j = cut.toLowerCase().indexOf(term);
      return (a ? "…" : "") + (j < 0 ? esc(cut) : esc(cut.slice(0, j)) + "<mark>" + esc(cut.slice(j, j + term.length)) +
        "</mark>" + esc(cut.slice(j + term.length))) + (a + 160 < text.length ? "…" : "");
    }
    function run() {
      var terms = box.value.toLowerCase().split(/\s+/).filter(function (t) { return t.length > 1; });
      if (!terms.length) { list.hidden = true; list.innerHTML = ""; return; }
      var hits = [];
      PT.searchIndex.forEach(function (e) {
        var head = (e.t + " " + e.s).toLowerCase(), body = e.x.toLowerCase(), score = 0;
        for (var i = 0; i < terms.length; i++) {  // a title match, then how often the text says it (up to 5)
          var inHead = head.indexOf(terms[i]) >= 0, n = 0, k = body.indexOf(terms[i]);
          while (k >= 0 && n < 5) { n++; k = body.indexOf(terms[i], k + terms[i].length); }
          if (!inHead && !n) return;
          score += (inHead ? 5 : 0) + n;
        }
        hits.push([score, e]);
      });
      hits.sort(function (a, b) { return b[0] - a[0]; });
      list.innerHTML = hits.slice(0, 12).map(function (h) {
        var e = h[1];
        return '<li><a href="' + esc(PT.root + e.u) + '"><b>' + esc(e.t) + "</b>" + (e.s ? " · " + esc(e.s) : "") +
          "<span>" + snippet(e.x, terms[0]) + "</span></a></li>";
      }).join("") || "<li class=\"none\">nothing found</li>";
      list.hidden = false;
    }
    box.addEventListener("input", function () { load(run); });
    box.addEventListener("focus", function () { load(function () {}); });
    box.addEventListener("keydown", function (ev) {
      if (ev.key === "Escape") { box.value = ""; run(); }
      if (ev.key === "Enter") { var a = list.querySelector("a"); if (a) location.href = a.href; }
    });
    document.addEventListener("click", function (ev) { if (!ev.target.closest(".search")) list.hidden = true; });
  }

  var widgets = document.querySelectorAll(".widget");
  widgets.forEach(build);
  var phone = window.innerWidth < PHONE;
  window.addEventListener("resize", function () {
    if ((window.innerWidth < PHONE) === phone) return;
    phone = !phone;
    widgets.forEach(function (el) { el.ptRedraw(); });
  });
  progress();
  highlightSource();
  sidebar();
  search();
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", math);
  else math();
})();
