/* Multi-panel figures on a narrow screen: panels one under the other.
 *
 * Plotly lays subplots out in fractions of the figure's width, so panels side by side on a desktop
 * become slivers on a phone, with their colour bars and titles on top of each other. A figure whose
 * layout.meta.stack describes its panels (attnbook.widgets._style.stack_panels writes it:
 * {panels: [[layout keys of one unit, e.g. "xaxis2", "yaxis2"] or ["scene"], ...] in reading order,
 * heights: [px per unit], narrow: {extra layout properties when stacked}}) is relaid out when its
 * container is narrower than NARROW_PX: each unit full width, one under the other, its subplot title
 * and colour bars moved with it, the figure as tall as its units; wider again, it gets its own layout
 * back. Only the layout and the colour bars' positions change (Plotly.update), never the data or the
 * frames, so sliders keep working. Figures without meta.stack keep their layout. Every figure's box
 * takes the height it draws (fitBox), so that no figure spills over the text below it.
 */
(function () {
  "use strict";

  var NARROW_PX = 600;        // below this container width, stack
  var COLORBAR_PX = 62;       // strip kept at the right for colour bars (bar, ticks, title)
  var GAP_TOP_PX = 34;        // above a unit: its subplot title
  var GAP_BOTTOM_PX = 58;     // under a unit: tick labels and the x-axis title
  var states = typeof WeakMap === "function" ? new WeakMap() : null;

  function plotly() { return window.Plotly; }

  function stackOf(gd) {
    var meta = gd && gd.layout && gd.layout.meta;
    var stack = meta && typeof meta === "object" ? meta.stack : null;
    if (!stack || !Array.isArray(stack.panels) || stack.panels.length < 2) return null;
    return stack;
  }

  function getPath(obj, path) {
    var parts = path.replace(/\[(\d+)\]/g, ".$1").split(".");
    for (var i = 0; i < parts.length; i++) {
      if (obj === null || obj === undefined) return undefined;
      obj = obj[parts[i]];
    }
    return obj;
  }

  function copy(v) {
    return Array.isArray(v) ? v.slice() : (v === undefined ? null : v);
  }

  function axisRef(ref, letter) {          // "x2" -> "xaxis2"
    return letter + "axis" + String(ref || letter).slice(1);
  }

  // Bounding box (paper fractions) of a unit's panels in the full (computed) layout.
  function extent(full, keys) {
    var xs = [], ys = [];
    keys.forEach(function (key) {
      var obj = full[key];
      if (!obj || !obj.domain) return;
      if (key.indexOf("scene") === 0) {
        xs = xs.concat(obj.domain.x || [0, 1]);
        ys = ys.concat(obj.domain.y || [0, 1]);
      } else if (key.indexOf("xaxis") === 0) {
        xs = xs.concat(obj.domain);
      } else {
        ys = ys.concat(obj.domain);
      }
    });
    if (!xs.length) xs = [0, 1];
    if (!ys.length) ys = [0, 1];
    return {x0: Math.min.apply(null, xs), x1: Math.max.apply(null, xs),
            y0: Math.min.apply(null, ys), y1: Math.max.apply(null, ys)};
  }

  function unitOfKey(units, key) {
    for (var u = 0; u < units.length; u++) {
      if (units[u].indexOf(key) >= 0) return u;
    }
    return -1;
  }

  // Colour bars, each with the unit its trace draws in: a trace's own ({trace: i}) or a coloraxis's.
  function colorbars(gd, units) {
    var out = [], seen = {};
    var full = gd._fullLayout;
    (gd._fullData || []).forEach(function (tr) {
      if (!tr || tr.visible === false) return;
      var key = tr.scene ? tr.scene : axisRef(tr.xaxis, "x");
      var u = unitOfKey(units, key);
      if (u < 0) return;
      var ca = tr.coloraxis;
      if (ca && full[ca]) {
        if (!seen[ca] && full[ca].showscale) out.push({unit: u, layout: ca});
        seen[ca] = true;
      } else if (tr.showscale && tr.colorbar && typeof tr.index === "number") {
        out.push({unit: u, trace: tr.index});
      }
    });
    return out;
  }

  // Subplot titles (paper-positioned annotations) just above or inside a unit's box.
  function annotationsOf(full, boxes) {
    var out = [];
    (full.annotations || []).forEach(function (a, i) {
      if (a.xref !== "paper" || a.yref !== "paper") return;
      for (var u = 0; u < boxes.length; u++) {
        var b = boxes[u];
        if (a.x >= b.x0 - 0.01 && a.x <= b.x1 + 0.01 && a.y >= b.y0 - 0.01 && a.y <= b.y1 + 0.08) {
          out.push({index: i, unit: u});
          return;
        }
      }
    });
    return out;
  }

  var CB_PROPS = ["x", "y", "len", "lenmode", "xanchor", "yanchor", "xref", "yref"];

  // Everything the stacked layout changes, read once from the figure as built (its wide form).
  function capture(gd, stack) {
    var full = gd._fullLayout;
    var units = stack.panels.filter(function (unit) {
      return Array.isArray(unit) && unit.every(function (k) { return full[k] && full[k].domain; });
    });
    if (units.length < 2) return null;
    var boxes = units.map(function (unit) { return extent(full, unit); });
    var layout = {height: full.height};
    units.forEach(function (unit) {
      unit.forEach(function (key) {
        var d = full[key].domain;
        if (key.indexOf("scene") === 0) {
          layout[key + ".domain.x"] = copy(d.x);
          layout[key + ".domain.y"] = copy(d.y);
        } else {
          layout[key + ".domain"] = copy(d);
        }
      });
    });
    var notes = annotationsOf(full, boxes);
    notes.forEach(function (n) {
      layout["annotations[" + n.index + "].x"] = full.annotations[n.index].x;
      layout["annotations[" + n.index + "].y"] = full.annotations[n.index].y;
    });
    var bars = colorbars(gd, units);
    var traceBars = [];
    bars.forEach(function (b) {
      var cb = b.layout ? full[b.layout].colorbar : gd._fullData[b.trace].colorbar;
      var wide = {};
      CB_PROPS.forEach(function (p) { wide[p] = copy(cb[p]); });
      if (b.layout) {
        CB_PROPS.forEach(function (p) { layout[b.layout + ".colorbar." + p] = wide[p]; });
      } else {
        traceBars.push({trace: b.trace, wide: wide});
      }
    });
    var narrow = stack.narrow && typeof stack.narrow === "object" ? stack.narrow : {};
    Object.keys(narrow).forEach(function (k) { layout[k] = copy(getPath(gd.layout, k)); });
    var heights = units.map(function (_, u) {
      var h = Array.isArray(stack.heights) ? Number(stack.heights[u]) : Number(stack.height);
      return h > 0 ? h : 300;
    });
    return {units: units, boxes: boxes, notes: notes, bars: bars, traceBars: traceBars,
            wide: layout, narrow: narrow, heights: heights, mode: "wide", busy: false};
  }

  function stackedLayout(gd, st) {
    var full = gd._fullLayout;
    var margin = full.margin || {};
    var total = st.heights.reduce(function (a, b) { return a + b; }, 0);
    var width = (full._size && full._size.w) || (gd.clientWidth - (margin.l || 0) - (margin.r || 0)) || 300;
    var strip = st.bars.length ? Math.min(0.3, COLORBAR_PX / width) : 0;
    var layout = {height: Math.round((margin.t || 0) + (margin.b || 0) + total)};
    var traceUpdate = {}, traceIndices = [];
    var top = 0;
    var slots = st.units.map(function (unit, u) {
      var h = st.heights[u];
      var gapTop = Math.min(GAP_TOP_PX, h / 4), gapBottom = Math.min(GAP_BOTTOM_PX, h / 4);
      var slot = {y1: 1 - (top + gapTop) / total, y0: 1 - (top + h - gapBottom) / total, x0: 0, x1: 1 - strip};
      top += h;
      return slot;
    });
    function mapper(u) {
      var b = st.boxes[u], s = slots[u];
      var fx = (s.x1 - s.x0) / Math.max(b.x1 - b.x0, 1e-9), fy = (s.y1 - s.y0) / Math.max(b.y1 - b.y0, 1e-9);
      return {
        x: function (v) { return s.x0 + (v - b.x0) * fx; },
        y: function (v) { return s.y0 + (v - b.y0) * fy; }
      };
    }
    st.units.forEach(function (unit, u) {
      var m = mapper(u);
      unit.forEach(function (key) {
        var d = full[key].domain;
        if (key.indexOf("scene") === 0) {
          layout[key + ".domain.x"] = [Math.max(0, m.x(d.x[0])), Math.min(1, m.x(d.x[1]))];
          layout[key + ".domain.y"] = [Math.max(0, m.y(d.y[0])), Math.min(1, m.y(d.y[1]))];
        } else if (key.indexOf("xaxis") === 0) {
          layout[key + ".domain"] = [Math.max(0, m.x(d[0])), Math.min(1, m.x(d[1]))];
        } else {
          layout[key + ".domain"] = [Math.max(0, m.y(d[0])), Math.min(1, m.y(d[1]))];
        }
      });
    });
    st.notes.forEach(function (n) {
      var m = mapper(n.unit), a = st.wide;
      layout["annotations[" + n.index + "].x"] = m.x(a["annotations[" + n.index + "].x"]);
      layout["annotations[" + n.index + "].y"] = m.y(a["annotations[" + n.index + "].y"]);
    });
    st.units.forEach(function (_, u) {
      var mine = st.bars.filter(function (b) { return b.unit === u; });
      var s = slots[u], len = (s.y1 - s.y0) / Math.max(mine.length, 1);
      mine.forEach(function (b, j) {
        var pos = {x: 1 - strip + 6 / width, xanchor: "left", xref: "paper", y: s.y1 - (j + 0.5) * len,
                   yanchor: "middle", yref: "paper", len: 0.92 * len, lenmode: "fraction"};
        if (b.layout) {
          CB_PROPS.forEach(function (p) { layout[b.layout + ".colorbar." + p] = pos[p]; });
        } else {
          traceIndices.push(b.trace);
          CB_PROPS.forEach(function (p) {
            (traceUpdate["colorbar." + p] = traceUpdate["colorbar." + p] || []).push(pos[p]);
          });
        }
      });
    });
    Object.keys(st.narrow).forEach(function (k) { layout[k] = st.narrow[k]; });
    return {layout: layout, traces: traceUpdate, indices: traceIndices};
  }

  function wideLayout(st) {
    var traces = {}, indices = [];
    st.traceBars.forEach(function (b) {
      indices.push(b.trace);
      CB_PROPS.forEach(function (p) { (traces["colorbar." + p] = traces["colorbar." + p] || []).push(b.wide[p]); });
    });
    return {layout: st.wide, traces: traces, indices: indices};
  }

  function apply(gd, st, mode) {
    var P = plotly();
    var change = mode === "narrow" ? stackedLayout(gd, st) : wideLayout(st);
    st.busy = true;
    var done = function () {
      st.busy = false;
      st.mode = mode;
      fitBox(gd);
      gd.setAttribute("data-layout", mode); // what it shows now (the browser check waits for it)
      schedule(gd);                       // the width may have changed meanwhile
    };
    var promise = change.indices.length
      ? P.update(gd, change.traces, change.layout, change.indices)
      : P.relayout(gd, change.layout);
    if (promise && typeof promise.then === "function") {
      promise.then(done, function () {
        st.busy = false;
        st.mode = mode;
        fitBox(gd);
        gd.setAttribute("data-layout", mode);
      });
    } else {
      done();
    }
  }

  // The box a figure is drawn in grows with what it draws. Plotly's HTML gives the figure a box of fixed
  // height (the figure's height when it was built) and draws the figure at its layout's height, whatever
  // the box: a figure restacked taller (or any figure taller than its box) would spill over the text
  // below it. The box takes the drawn height.
  function fitBox(gd) {
    var full = gd._fullLayout;
    var box = gd.parentElement;
    if (!full || !box || !box.style || !/px$/.test(box.style.height || "")) return;
    var drawn = Math.ceil(full.height || 0);
    if (drawn > 0 && Math.abs(parseFloat(box.style.height) - drawn) > 0.5) box.style.height = drawn + "px";
  }

  function check(gd) {
    try {
      var P = plotly();
      if (!P || !gd || !gd._fullLayout || !gd.isConnected) return;
      fitBox(gd);
      var stack = stackOf(gd);
      if (!stack) return;
      var st = states ? states.get(gd) : gd.__stackState;
      if (st === undefined) {
        st = capture(gd, stack);
        if (states) states.set(gd, st); else gd.__stackState = st;
        if (st && typeof ResizeObserver === "function") {
          new ResizeObserver(function () { schedule(gd); }).observe(gd);
        }
      }
      if (!st || st.busy) return;
      var width = gd.getBoundingClientRect().width;
      if (!(width > 0)) return;            // hidden (a collapsed cell): decide when it is shown
      var mode = width < NARROW_PX ? "narrow" : "wide";
      if (mode !== st.mode) apply(gd, st, mode);
      else gd.setAttribute("data-layout", mode);
    } catch (e) {
      // a figure this script cannot read is left as Plotly drew it
    }
  }

  var pending = null;
  var queued = [];
  function schedule(gd) {
    if (queued.indexOf(gd) < 0) queued.push(gd);
    if (pending !== null) return;
    pending = window.setTimeout(function () {
      pending = null;
      var list = queued;
      queued = [];
      list.forEach(check);
    }, 120);
  }

  function scan() {
    var plots = document.querySelectorAll(".js-plotly-plot");
    for (var i = 0; i < plots.length; i++) schedule(plots[i]);
  }

  function start() {
    scan();
    window.addEventListener("resize", scan);
    // Figures are drawn by inline scripts, some after this one runs: look again as the page fills.
    if (typeof MutationObserver === "function") {
      var timer = null;
      new MutationObserver(function () {
        if (timer === null) timer = window.setTimeout(function () { timer = null; scan(); }, 300);
      }).observe(document.body, {childList: true, subtree: true});
    }
    [300, 1500, 4000].forEach(function (ms) { window.setTimeout(scan, ms); });
  }

  if (typeof document === "undefined" || typeof window === "undefined") return;
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
