// A box that scrolls sideways says so.
//
// On a phone a long display equation or a code listing is wider than the column and scrolls inside its
// own box; scroll bars there are hidden until touched, so the box looks cut off ("= so"). Each such box
// is marked with the sides it can scroll to (data-scroll="right", "left" or "both", updated as it
// scrolls and as the page resizes) and custom.css fades that edge, the usual sign that more is there.
// An equation's box is the one MathJax draws (mjx-container) once it has typeset it.
(function () {
  "use strict";

  var BOXES = "div.math, div.highlight pre";
  var listening = typeof WeakSet === "function" ? new WeakSet() : null;

  function scroller(el) {
    if (!el.matches("div.math")) return el;
    return el.querySelector('mjx-container[display="true"]') || el;
  }

  function mark(el) {
    var box = scroller(el);
    if (listening && !listening.has(box)) {
      listening.add(box);
      box.addEventListener("scroll", function () { mark(box); }, {passive: true});
    }
    var more = box.scrollWidth - box.clientWidth;
    var side = "";
    if (more > 1) {
      var left = box.scrollLeft > 1, right = box.scrollLeft < more - 1;
      side = left && right ? "both" : (left ? "left" : "right");
    }
    if (side) {
      if (box.getAttribute("data-scroll") !== side) box.setAttribute("data-scroll", side);
    } else if (box.hasAttribute("data-scroll")) {
      box.removeAttribute("data-scroll");
    }
  }

  function scan() {
    var boxes = document.querySelectorAll(BOXES);
    for (var i = 0; i < boxes.length; i++) mark(boxes[i]);
  }

  function start() {
    scan();
    window.addEventListener("resize", scan);
    window.addEventListener("load", scan);
    // an equation changes size when MathJax typesets it, whenever that is
    if (typeof ResizeObserver === "function") {
      var observer = new ResizeObserver(function (entries) {
        entries.forEach(function (entry) { mark(entry.target); });
      });
      var boxes = document.querySelectorAll(BOXES);
      for (var i = 0; i < boxes.length; i++) observer.observe(boxes[i]);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
