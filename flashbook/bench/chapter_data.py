"""What a data-heavy chapter's ``build(root)`` returns (``chapter9``, ``chapter10``): the
numbers its prose quotes, its tables and figures, and what each cell shows, recorded once
by the chapter's sections (``put``, ``nothing``, ``say``, ``figure``; each chapter adds how it
displays a table) and shown by the chapter's hidden cells (``show``, ``glued``)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ChapterData:
    """``values``: name -> the text glued into the prose ("n/a" where the data give none);
    ``tables``, ``figures`` (name -> a function drawing it); ``messages``: cell -> what it
    says because something is not recorded; ``outputs``: cell -> what it shows, in order."""

    values: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    messages: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    root: object = None              # the results root read (a Path), or None

    def put(self, name: str, value, fmt: str = "") -> None:
        """Record a value for the prose, formatted as ``glue_text`` formats it."""
        if name in self.values:
            raise ValueError(f"name must be glued once, and {name!r} already is")
        self.values[name] = "n/a" if value is None else format(value, fmt)

    def nothing(self, *names: str) -> None:
        """The values the data do not give: "n/a", as ``glue_text(name, None)``."""
        for name in names:
            self.put(name, None)

    def say(self, cell: str, text: str, *, missing: bool = False) -> None:
        """``cell`` prints ``text``; ``missing``: because something is not recorded."""
        self.outputs.setdefault(cell, []).append(("text", text))
        if missing:
            self.messages[cell] = (self.messages[cell] + "\n" + text) if cell in self.messages else text

    def figure(self, cell: str, name: str, draw) -> None:
        """``cell`` shows the figure ``draw()`` makes."""
        self.figures[name] = draw
        self.outputs.setdefault(cell, []).append(("figure", name))

    def glued(self) -> list:
        """(name, text) for every value the prose quotes."""
        return list(self.values.items())
