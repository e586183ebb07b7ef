// Search results quote a page's text. Its equations are TeX until MathJax typesets them on the page
// itself, so a result would show "\(\sum_j P_{ij}\)": show an ellipsis for each equation instead, and
// leave out the labs' outputs, which are numbers without their context. Sphinx quotes the theme's whole
// main block, whose first words are the page's buttons and its "Contents" box: quote the article alone.
document.addEventListener("DOMContentLoaded", () => {
  if (typeof Search === "undefined" || typeof Search.htmlToText !== "function") return;
  const toText = Search.htmlToText;
  Search.htmlToText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    doc.querySelectorAll(".math, mjx-container").forEach((el) => el.replaceWith("…"));
    doc.querySelectorAll(".cell_output, script, style").forEach((el) => el.remove());
    const main = doc.querySelector('[role="main"]');
    const article = doc.querySelector("article.bd-article");
    if (main && article && main !== article) main.replaceChildren(article);
    return toText(doc.documentElement.outerHTML, anchor);
  };
});
