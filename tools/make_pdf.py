"""Print the built HTML book as one PDF, offline: `make pdf` (after `make book`).

Each page of the table of contents is opened in the headless Chromium the
browser tests use (Debian's `chromium`, never a downloaded one), with every
request that is not a local file refused. Once MathJax has typeset the page, a
print stylesheet hides the navigation, every fold (hidden code, solutions,
dropdowns) is opened, and the page is printed; the pages are then merged in
table-of-contents order into one PDF with a bookmark per page.

    python tools/make_pdf.py [--html _build/html] [--out _build/pdf/flashbook.pdf]
"""
import argparse
import re
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

#: The printed page: no sidebars, header buttons or prev/next links; the article
#: takes the full width; code wraps instead of running off the page.
PRINT_CSS = """
@page { size: A4; margin: 16mm 14mm 16mm 14mm; }
.bd-header, .bd-sidebar-primary, .bd-sidebar-secondary, .bd-header-article,
.bd-footer, .bd-footer-article, .prev-next-area, .footer-article-items,
#pst-back-to-top, .skip-link, .headerlink, .toggle-details__summary-text .toggle-hidden,
.sidebar-toggle, .search-button-field, .pst-scrollable-table-container::-webkit-scrollbar
  { display: none !important; }
.bd-main, .bd-content, .bd-article-container, .bd-article, .bd-page-width
  { max-width: 100% !important; width: 100% !important; margin: 0 !important;
    padding: 0 !important; }
pre, .highlight pre { white-space: pre-wrap !important; word-break: break-word; }
details.hide > summary { display: none !important; }
h1, h2, h3 { break-after: avoid; }
figure, img, table, .cell_output { break-inside: avoid; }
"""

#: Opens every fold, so that hidden inputs, solutions and dropdowns are printed.
OPEN_FOLDS = "() => { for (const d of document.querySelectorAll('details')) d.open = true; }"

#: Resolves once MathJax (if the page loads it) has typeset the whole page.
MATH_DONE = """async () => {
  const wants = document.querySelector('script[src*="mathjax"]');
  if (!wants) return 'no math';
  for (let i = 0; i < 400 && !(window.MathJax && MathJax.startup && MathJax.startup.promise); i++)
    await new Promise(r => setTimeout(r, 25));
  if (!(window.MathJax && MathJax.startup)) return 'MathJax did not load';
  await MathJax.startup.promise;
  if (MathJax.typesetPromise) await MathJax.typesetPromise();
  await document.fonts.ready;
  return 'typeset';
}"""


def toc_pages(toc_path: Path = ROOT / "_toc.yml") -> list[str]:
    """The book's pages in reading order, as paths without extension."""
    toc = yaml.safe_load(toc_path.read_text())
    pages = [toc["root"]]
    for part in toc.get("parts", []):
        pages += [ch["file"] for ch in part["chapters"]]
    return pages


def print_pages(html_dir: Path, pages: list[str], out_dir: Path, jobs: int = 2,
                timings: list | None = None) -> list[tuple[str, Path]]:
    """Print each page to its own PDF, ``jobs`` pages at a time; returns
    (title, path) in the order of ``pages``."""
    import asyncio

    from playwright.async_api import async_playwright

    for rel in pages:
        if not (html_dir / f"{rel}.html").exists():
            raise FileNotFoundError(f"{html_dir / rel}.html is missing: build the book first (make book)")
    blocked = []

    async def refuse(route):
        blocked.append(route.request.url)
        await route.abort()

    async def one(context, i, rel, gate):
        async with gate:
            t_page = time.perf_counter()
            page = await context.new_page()
            await page.goto((html_dir / f"{rel}.html").as_uri(), wait_until="load")
            if await page.evaluate(MATH_DONE) == "MathJax did not load":
                raise RuntimeError(f"{rel}: MathJax did not load, so its math would print raw")
            await page.add_style_tag(content=PRINT_CSS)
            await page.evaluate(OPEN_FOLDS)
            await page.emulate_media(media="print")
            title = (await page.title()).split("—")[0].split(" | ")[0].strip() or rel
            out = out_dir / f"{i:03d}.pdf"
            await page.pdf(path=str(out), format="A4", print_background=True,
                           margin={"top": "16mm", "bottom": "16mm", "left": "14mm", "right": "14mm"})
            await page.close()
            if timings is not None:
                timings.append((rel, time.perf_counter() - t_page))
            return title, out

    async def run():
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = await browser.new_context(offline=True)
            # nothing but the local files (and inline data) may be loaded
            await context.route(re.compile(r"^(?!file:|data:|blob:)"), refuse)
            gate = asyncio.Semaphore(jobs)
            printed = await asyncio.gather(*(one(context, i, rel, gate) for i, rel in enumerate(pages)))
            await browser.close()
            return list(printed)

    printed = asyncio.run(run())
    if blocked:
        print(f"refused {len(blocked)} network requests, e.g. {blocked[0]}", file=sys.stderr)
    return printed


def merge(printed: list[tuple[str, Path]], out: Path, title: str) -> int:
    """One PDF from the per-page ones, with a bookmark per page; returns its page count."""
    from pypdf import PdfWriter

    writer = PdfWriter()
    for name, path in printed:
        start = len(writer.pages)
        writer.append(str(path))
        writer.add_outline_item(title=name, page_number=start)
    writer.add_metadata({"/Title": title})
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        writer.write(f)
    return len(writer.pages)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "pdf" / "flashbook.pdf")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="pages printed at once (default 2)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each page's time")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    parts = args.out.parent / "pages"
    parts.mkdir(parents=True, exist_ok=True)
    timings = []
    printed = print_pages(args.html.resolve(), toc_pages(), parts, args.jobs, timings)
    if args.verbose:
        for rel, s in timings:
            print(f"  {s:5.1f} s  {rel}")
    title = yaml.safe_load((ROOT / "_config.yml").read_text())["title"]
    n = merge(printed, args.out, title)
    print(f"{args.out}: {n} pages from {len(printed)} book pages in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
