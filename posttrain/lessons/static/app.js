// posttrain lessons: builds each widget's knobs from its JSON spec, asks the server (or the
// precomputed data of a static export) for the widget's result, and draws it with plotly.
(function () {
  "use strict";
  var PT = window.PT = window.PT || {data: {}, static: false, api: "api/"};
  var STORE = "posttrain-lessons-done";

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

  function control(k, state, changed) {
    var wrap = document.createElement("label");
    wrap.className = "knob";
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
    var note = el.querySelector(".note"), err = el.querySelector(".error"), seq = 0;
    function update() {
      var mine = ++seq;
      el.dataset.busy = "1";
      result(spec, state).then(function (out) {
        if (mine !== seq) return;
        var layout = Object.assign({autosize: true}, out.figure.layout);
        return Plotly.react(plot, out.figure.data, layout, {displayModeBar: false, responsive: true}).then(function () {
          kpis.innerHTML = out.kpis.map(function (kv) {
            return '<div class="kpi"><span>' + esc(kv[0]) + "</span><b>" + esc(kv[1]) + "</b></div>";
          }).join("");
          note.textContent = out.note || "";
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
    document.querySelectorAll("li[data-lesson]").forEach(function (li) {
      if (done[li.dataset.lesson]) { li.classList.add("done"); n++; }
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

  document.querySelectorAll(".widget").forEach(build);
  progress();
  highlightSource();
})();
