"""The explorers under their first name: everything is in ``flashbook.explorers``
(chapter 4's explorer: ``flashbook/explorers/blocksize.py``)."""
from .explorers import *  # noqa: F401,F403
from .explorers import __all__  # noqa: F401
