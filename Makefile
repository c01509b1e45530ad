# Two commands for a fresh Linux machine with Python 3.11+ (see README.md):
#   make book   set up, then build the site into _build/html (with the kernels wheel and sdist
#               it offers for download, in _build/html/downloads)
#   make test   set up, then run the kernel tests, the notebooks (strict nbval) and the site checks
# Everything installs into .venv; nothing outside this folder is touched, except that
# `make test`, run as root, installs Debian's chromium for the browser check if it is missing.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The CPU build of torch on machines without a GPU; override on a GPU box, e.g. TORCH=torch.
TORCH  ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
MATHJAX := _vendor/mathjax/tex-chtml.js

.PHONY: setup book chromium test test-kernels test-notebooks clean

setup: $(VENV)/.installed $(MATHJAX)

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# MathJax 3 served from the site itself: Sphinx's default is a CDN, which offline readers
# (and our CI) cannot reach.
$(MATHJAX):
	rm -rf _vendor/mathjax .mathjax
	npm install --silent --no-save --no-audit --no-fund --prefix .mathjax mathjax@3
	mkdir -p _vendor && cp -r .mathjax/node_modules/mathjax/es5 _vendor/mathjax
	rm -rf .mathjax

book: setup
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium not found: the browser check will be skipped (install Debian's chromium to run it)"; fi; }

test: setup chromium
	$(PY) -m pytest -n 2 --dist loadfile tests/ book/ --nbval -p no:cacheprovider

test-kernels: setup
	$(PY) -m pytest -n 2 tests/ -m "not site"

test-notebooks: setup
	$(PY) -m pytest -n 2 --dist loadfile --nbval book/

clean:
	rm -rf _build .venv _vendor/mathjax
