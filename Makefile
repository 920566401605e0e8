# flashbook: `make book` builds the HTML book, `make test` runs every test.
# Both create their own virtual environment (.venv) on first use.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Installed before requirements.txt so that nothing pulls a different torch build. From PyPI on
# Linux x86-64 this is the CUDA build (it runs on a CPU too); pip's options may follow, e.g. for
# the smaller CPU-only build: make book TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
BUILD  := _build/html
PORT   ?= 8000
PYTEST_ARGS ?=

.PHONY: book test serve venv browser clean gpu-test student colab colab-venv pdf editions

# tools/venv_install.py installs with uv (from the package index into the venv; pip where uv
# cannot be had): torch first, requirements-dev.txt, then flashbook itself, editable.
venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) tools/venv_install.py "$(TORCH_SPEC)"
	$(PY) -m ipykernel install --prefix $(VENV) --name python3 >/dev/null
	touch $@

# The notebooks are executed side by side into the build's cache first (tools/prefill_cache.py);
# jupyter-book then finds each one there and executes only the Markdown pages.
book: venv
	$(PY) tools/prefill_cache.py
	$(VENV)/bin/jupyter-book build . -W -n --keep-going
	@echo
	@echo "The book is built: open $(abspath $(BUILD))/index.html"
	@echo "or run 'make serve' and visit http://localhost:$(PORT)/"

# Headless Chromium for the browser tests and the PDF (Debian's package; never a
# downloaded browser), and a Chinese font so that the appendix's quotes print.
browser:
	@{ command -v chromium >/dev/null 2>&1 && fc-list :lang=zh | grep -q .; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-wqy-microhei >/dev/null; \
	  else echo "install Debian's 'chromium' and 'fonts-wqy-microhei' packages to run the browser tests and make pdf"; fi; }

# The Colab-like runtime's packages (torch first, numpy 2.0.2, ipywidgets 7.7.1, ...; nothing
# of flashbook) in a venv of their own, kept in the user's cache (~/.cache/flashbook/colab-venv-*)
# so that a fresh clone on a machine that has run the tests finds it built. tests/colab_like.py
# holds the list and builds it when it is missing, holds another list or is a month old
# (standard library only, so it runs while .venv is being filled); the Colab test layers a
# fresh venv on top of it for each run.
colab-venv:
	$(PYTHON) tests/colab_like.py

# Debian's chromium and the Colab-like venv install while the book is built (three jobs:
# the network, the disk and two cores); only pytest needs them. The packages' bytecode is
# compiled at install: where PYTHONDONTWRITEBYTECODE is set (CI's machine sets it) nothing
# compiled later is kept, and every process would compile what it imports again (torch's
# import: 1.6 s with its bytecode, 2.6 s without, measured here).
#
# pytest's two workers each take the next test when they are nearly out of work (loadgroup,
# collection order kept); tests/conftest.py puts the longest first, so they spread over both.
test:
	$(MAKE) -j3 editions browser colab-venv
	$(PY) -m pytest -m "not gpu" -n 2 --dist loadgroup --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

# The book, then the Colab edition from it (one after the other: colab reads the built book).
editions: venv
	$(MAKE) book
	$(MAKE) colab

# The whole book as one PDF, printed offline from the built HTML: _build/pdf/flashbook.pdf
pdf: book browser
	$(PY) tools/make_pdf.py

# On a CUDA machine: the GPU test matrix, then the stress suite (tests/test_stress_gpu.py).
# The matrix on four workers: each holds its own CUDA context and its largest test's tensors,
# and 8 or 16 of them (-n auto on a 16-core GPU host) ran an 80 GB H100 and a 141 GB H200 out
# of memory. The stress suite's tensors are small and its time is compiling (float32 kernels
# take minutes each), so it takes one worker per core (STRESS_WORKERS), one CPU thread each.
STRESS_WORKERS ?= auto
gpu-test: venv
	$(PY) -m pytest -m gpu -n 4 --dist loadgroup --no-loadscope-reorder --ignore=tests/test_stress_gpu.py $(PYTEST_ARGS)
	OMP_NUM_THREADS=1 $(PY) -m pytest -m gpu -n $(STRESS_WORKERS) --dist loadgroup --no-loadscope-reorder \
	  tests/test_stress_gpu.py $(PYTEST_ARGS)

serve:
	@test -f $(BUILD)/index.html || $(MAKE) book
	@echo "Serving http://localhost:$(PORT)/ (Ctrl-C to stop)"
	$(PY) -m http.server $(PORT) --bind 127.0.0.1 --directory $(BUILD)

# The Colab edition, from the built book's notebooks (glued numbers filled in, plain
# Markdown, solutions folded): _build/colab/. Nothing is executed again.
colab: venv
	@test -d _build/jupyter_execute || $(MAKE) book
	$(PY) tools/colab_edition.py _build/colab

# The same without the solutions, for a class: _build/student/
student: venv
	@test -d _build/jupyter_execute || $(MAKE) book
	$(PY) tools/colab_edition.py --student _build/student

clean:
	rm -rf _build
