/* Hovering a cell of an attention map outlines the query's whole row: the plan of that one query, its
 * unit of mass spread over the keys. A figure opts in with layout.meta.hover_rows (attnlib's
 * widgets._style.hover_rows writes it); the outline is one layout shape, named "hover-row", added on
 * hover and removed when the pointer leaves, so the figure's own shapes and its frames are untouched.
 */
(function () {
  "use strict";

  var NAME = "hover-row";

  function opted(gd) {
    var meta = gd && gd.layout && gd.layout.meta;
    return !!(meta && typeof meta === "object" && meta.hover_rows);
  }

  function withoutOutline(gd) {
    return ((gd.layout && gd.layout.shapes) || []).filter(function (s) { return s.name !== NAME; });
  }

  function rowShape(point) {
    var xa = point.xaxis, ya = point.yaxis;
    // a heatmap's pointNumber is [row, column]; on a category axis rows sit at 0, 1, 2 ...
    var row = Array.isArray(point.pointNumber) ? point.pointNumber[0] : null;
    var y = ya.type === "category" && row !== null ? row : Number(point.y);
    if (!isFinite(y)) return null;
    return {
      type: "rect", name: NAME, layer: "above", xref: xa._id + " domain", x0: 0, x1: 1,
      yref: ya._id, y0: y - 0.5, y1: y + 0.5,
      line: { color: "#d55e00", width: 2 }, fillcolor: "rgba(0, 0, 0, 0)"
    };
  }

  function attach(gd) {
    if (gd.__hoverRows || !opted(gd) || typeof gd.on !== "function") return;
    gd.__hoverRows = true;
    gd.on("plotly_hover", function (ev) {
      var point = ev && ev.points && ev.points[0];
      if (!point || point.data.type !== "heatmap") return;
      var shape = rowShape(point);
      if (shape) window.Plotly.relayout(gd, { shapes: withoutOutline(gd).concat([shape]) });
    });
    gd.on("plotly_unhover", function () {
      if (withoutOutline(gd).length !== ((gd.layout && gd.layout.shapes) || []).length) {
        window.Plotly.relayout(gd, { shapes: withoutOutline(gd) });
      }
    });
  }

  function scan() {
    if (!window.Plotly) return;
    document.querySelectorAll(".js-plotly-plot").forEach(attach);
  }

  var pending = false;
  function scanSoon() {
    if (pending) return;
    pending = true;
    window.setTimeout(function () { pending = false; scan(); }, 200);
  }

  window.addEventListener("load", function () {
    scan();
    // figures drawn after the page loaded (a slow notebook output) are picked up too
    new MutationObserver(scanSoon).observe(document.body, { childList: true, subtree: true });
  });
})();
