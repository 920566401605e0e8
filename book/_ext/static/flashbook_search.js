// The search page: each result's snippet is cut from the page's text with its math as
// plain text ("N × N", not "\(N\times N\)"). The build writes that text into each math
// element's data-plain (book/_ext/flashbook_sphinx.py, plain_math); Sphinx's own
// Search.htmlToText then reads the page as usual.
(function () {
  "use strict";
  const patch = () => {
    if (typeof Search === "undefined" || Search.flashbookPlainMath) return;
    const htmlToText = Search.htmlToText;
    Search.htmlToText = (htmlString, anchor) => {
      const doc = new DOMParser().parseFromString(htmlString, "text/html");
      for (const m of doc.querySelectorAll(".math[data-plain]")) m.replaceWith(doc.createTextNode(m.dataset.plain));
      return htmlToText(doc.documentElement.outerHTML, anchor);
    };
    Search.flashbookPlainMath = true;
  };
  patch();
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", patch);
})();
