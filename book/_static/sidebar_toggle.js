// The table of contents on every page, at every width.
//
// The page has two ☰ buttons (class "primary-toggle"): a hidden one in the theme's navbar and the visible
// one in the article's header. The theme's scripts (pydata-sphinx-theme opens the drawer below 992 px,
// sphinx-book-theme collapses the sidebar above) listen on the first only, so tapping the visible one
// did nothing but show its tooltip. A click on any other ☰ is passed to that first button, which the
// theme's handlers answer as they would their own; the same for the page-contents button.
(function () {
  "use strict";

  function forward(selector) {
    var buttons = document.querySelectorAll(selector);
    if (buttons.length < 2) return;
    var bound = buttons[0];
    for (var i = 1; i < buttons.length; i++) {
      buttons[i].addEventListener("click", function (event) {
        event.preventDefault();
        event.stopImmediatePropagation();
        bound.click();
      }, true);
    }
  }

  function start() {
    forward(".primary-toggle");
    forward(".secondary-toggle");
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
