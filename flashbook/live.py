"""The live explorers under their first name: everything is in ``flashbook.explorers``
(the widget and the static book's placeholder: ``flashbook/explorers/widget.py``)."""
from .explorers import *  # noqa: F401,F403
from .explorers import __all__  # noqa: F401
