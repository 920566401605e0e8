"""Words of page text per chapter: what a reader scrolls through.

    python tools/page_words.py                      # every chapter of the built book (_build/html)
    python tools/page_words.py /tmp/site/html       # every chapter of a book built elsewhere
    python tools/page_words.py notebooks/10_making_it_fast.ipynb   # one notebook, before a build
    python tools/page_words.py PAGE.html            # one page, e.g. from a one-page build:
        jupyter-book build --path-output /tmp/one notebooks/08_triton_backward.ipynb
        -> /tmp/one/_build/_page/08_triton_backward/html/08_triton_backward.html

On a built page it counts the words of the page's <main> (prose, code, outputs and
folded cells alike; scripts and styles left out). On a notebook it counts the same
parts from the file: Markdown, code, and the text of the outputs (executed notebooks
give the closer count; glued values show as their names until the book is built).
"""
import glob
import html
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = 12_000  # words of page text per chapter (a lesson, not a lab log)


def html_words(path):
    text = open(path, encoding="utf-8").read()
    main = re.search(r"<main.*?</main>", text, re.S)
    body = main.group(0) if main else text
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", body, flags=re.S)
    return len(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


def notebook_words(path):
    nb = json.load(open(path, encoding="utf-8"))
    words = 0
    for cell in nb["cells"]:
        words += len("".join(cell.get("source", "")).split())
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            text = out.get("text") or data.get("text/markdown") or data.get("text/plain") or ""
            if "text/html" in data and "text/markdown" not in data:
                text = re.sub(r"<[^>]+>", " ", "".join(data["text/html"]))
            words += len("".join(text).split())
    return words


def main(argv):
    paths = []
    for arg in argv or [os.path.join(ROOT, "_build", "html")]:
        # a built site's folder: its chapters (notebooks/*.html), as with no argument
        paths += sorted(glob.glob(os.path.join(arg, "notebooks", "*.html"))) if os.path.isdir(arg) else [arg]
    if not paths:
        sys.exit("no built pages: run `make book`, or name a notebook")
    over = 0
    for path in paths:
        n = notebook_words(path) if path.endswith(".ipynb") else html_words(path)
        over += n > LIMIT
        print(f"{n:7,d}  {'over' if n > LIMIT else '    '}  {os.path.relpath(path, ROOT)}")
    return over


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1:]) else 0)   # 1: a chapter is over the limit
