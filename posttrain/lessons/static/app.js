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
  function tidy(layout, data, width) {
    var out = JSON.parse(JSON.stringify(layout || {}));
    var narrow = width < PHONE, font = narrow ? 11 : 12;
    out.autosize = true;
    out.font = Object.assign({size: font}, out.font || {});
    out.separators = out.separators || ".,";
    var title = out.title;
    if (typeof title === "string") title = {text: title};
    if (title && title.text) {
      out.title = Object.assign({}, title, {x: 0, xref: "paper", xanchor: "left", y: 1, yref: "container",
        yanchor: "top", pad: {t: 8}, automargin: true,
        font: Object.assign({}, title.font || {}, {size: narrow ? 13 : 14})});
    }
    Object.keys(out).forEach(function (k) {
      if (!/^[xy]axis\d*$/.test(k)) return;
      var ax = out[k] = Object.assign({}, out[k]);
      ax.automargin = true;
      if (typeof ax.title === "string") ax.title = {text: ax.title};
      if (ax.title) ax.title = Object.assign({standoff: 6}, ax.title);
      if (!ax.hoverformat && ax.type !== "category" && ax.type !== "date") ax.hoverformat = ".4~g";
      if (narrow) ax.tickfont = Object.assign({size: 10}, ax.tickfont || {});
    });
    var named = (data || []).filter(function (t) { return t.name && t.showlegend !== false; }).length;
    if (out.showlegend !== false && named > 1 || out.showlegend === true) {
      out.legend = Object.assign({}, out.legend || {}, {orientation: "h", x: 0, xanchor: "left", xref: "container",
        y: 0, yanchor: "bottom", yref: "container", font: {size: narrow ? 10 : 11}});
    }
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
      var layout = tidy(out.figure.layout, out.figure.data, plot.clientWidth || 800);
      return Plotly.react(plot, out.figure.data, layout, {displayModeBar: false, responsive: true});
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
    var loading = false;
    function load(then) {
      if (PT.searchIndex) return then();
      if (loading) return;
      loading = true;
      var s = document.createElement("script");
      s.src = PT.root + "search-index.js";
      s.onload = then;
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
        for (var i = 0; i < terms.length; i++) {
          var inHead = head.indexOf(terms[i]) >= 0, inBody = body.indexOf(terms[i]) >= 0;
          if (!inHead && !inBody) return;
          score += (inHead ? 5 : 0) + (inBody ? 1 : 0);
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
