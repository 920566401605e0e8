"""Write the student edition of the notebooks: every cell tagged `solution` removed.

    python tools/student_edition.py [OUT_DIR]     (default: _build/student)

A teacher hands out OUT_DIR/*.ipynb; the exercises keep their specs, stubs and
checks, and the solutions stay with the teacher.
"""
from __future__ import annotations

import glob
import os
import sys

import nbformat

from flashbook.grade import strip_solutions  # noqa: F401  (the one definition; tests import it from here too)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    for path in sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb"))):
        nb = nbformat.read(path, as_version=4)
        removed = strip_solutions(nb)
        nbformat.write(nb, os.path.join(out_dir, os.path.basename(path)))
        print(f"{os.path.basename(path)}: {removed} solution cells removed")
    print(f"student edition written to {os.path.abspath(out_dir)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "_build", "student"))
