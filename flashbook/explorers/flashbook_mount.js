// The static book: mount flashbook's explorers on the placeholders that the
// explorer cells left in the page (loaded only where there is one).
if (document.querySelector("div.flashbook-explorer")) {
  import("./flashbook_explorers.js").then((m) => m.mountStatic(document));
}
