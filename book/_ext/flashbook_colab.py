"""The Colab launch button opens the chapter's Colab edition, not its MyST source.

sphinx-book-theme points the button at ``blob/<branch>/notebooks/NN_slug.ipynb``, the
book's own notebook, which Colab shows with raw MyST roles. The workflow publishes
the Colab edition (tools/colab_edition.py) to the ``colab`` branch; this points the
button there: ``.../blob/colab/NN_slug.ipynb``, and adds a second one beside it,
"Exercises", which opens the student edition (``.../blob/colab/student/NN_slug.ipynb``).

A page outside ``notebooks/`` (the sources checked, the which-kernel page) has no Colab
edition, and Colab cannot open its MyST Markdown: its launch buttons are removed.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tools"))

from colab_edition import colab_url, is_chapter  # noqa: E402


def _retarget(buttons, slug, exercises):
    for i, button in enumerate(list(buttons)):
        if not isinstance(button, dict):
            continue
        if button.get("text") == "Colab" and "url" in button:
            button["url"] = colab_url(slug)
            if exercises:
                student = dict(button, text="Exercises", url=colab_url(slug, student=True),
                               tooltip="Open the exercises (no solutions) in Colab",
                               label="exercises-colab-button")
                buttons.insert(buttons.index(button) + 1, student)
        _retarget(button.get("buttons", []), slug, exercises)


def _without_launch(buttons):
    """The header buttons less the launch menu (Colab, Binder, ...), at any depth."""
    kept = []
    for button in buttons:
        if isinstance(button, dict) and "launch" in str(button.get("label", "")).lower():
            continue
        if isinstance(button, dict) and button.get("text") == "Colab":
            continue
        if isinstance(button, dict) and button.get("buttons"):
            button = dict(button, buttons=_without_launch(button["buttons"]))
        kept.append(button)
    return kept


def _colab_button(app, pagename, templatename, context, doctree):
    if not context.get("header_buttons"):
        return
    if pagename.startswith("notebooks/"):
        slug = pagename.split("/")[-1]
        _retarget(context["header_buttons"], slug, exercises=is_chapter(slug))
    else:
        context["header_buttons"] = _without_launch(context["header_buttons"])


def setup(app):
    # after sphinx-book-theme's add_launch_buttons (priority 501) has made the button
    app.connect("html-page-context", _colab_button, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
