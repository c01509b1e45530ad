# Two commands for a fresh Linux machine with Python 3.11+ (see README.md):
#   make book   set up, then build the site into _build/html (with the attention_kernels wheel and sdist
#               it offers for download, in _build/html/downloads)
#   make listings  refresh the code the chapters show from the package's source (no GPU, no other cell run)
#   make tables    list the declared benchmark tables that have no committed results yet
#   make readme    rewrite README.md's results table from the committed tables in results/
#   make test   set up, then run the kernel tests, the notebooks (strict nbval) and the site checks
#               with the pinned Triton (requirements.txt), then the kernel tests and the notebooks
#               again with the newest Triton (TRITON_NEXT; `make test-triton-next` runs that part alone)
# Everything installs into .venv (the newest Triton into .triton-next); nothing outside this folder is
# touched, except that `make test`, run as root, installs Debian's chromium for the browser check if
# it is missing.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# torch: on a GPU box PyPI's build (CUDA); elsewhere PyTorch's CPU build (a 190 MB wheel, where PyPI's
# build brings several GB of CUDA libraries), which only PyTorch's own index holds. Override either,
# e.g. TORCH=torch TORCH_INDEX= . Setup installs torch alone from that index, then its dependencies from
# the usual one, so that a machine that cannot reach PyTorch's index but holds the wheel (pip's
# find-links) loses pip's retries of one look-up (about 8 s), not of one for each dependency.
ifeq ($(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu),gpu)
TORCH       ?= torch
TORCH_INDEX ?=
else
TORCH       ?= torch==2.13.0+cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
endif
# The newest Triton release: the kernel tests and the notebooks run under its interpreter too.
TRITON_NEXT ?= 3.9.0
NEXT        := .triton-next
MATHJAX := _vendor/mathjax/tex-chtml.js

.PHONY: setup book listings tables readme chromium test test-kernels test-notebooks test-triton-next clean

setup: $(VENV)/.installed $(MATHJAX)

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-deps $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) "$(TORCH)"
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

listings: setup
	$(PY) scripts/refresh_listings.py

tables: setup
	$(PY) scripts/unmeasured_tables.py

readme: setup
	$(PY) scripts/readme_results.py

chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium not found: the browser check will be skipped (install Debian's chromium to run it)"; fi; }

test: setup chromium
	$(PY) -m pytest -n 2 --dist loadfile tests/ book/ --nbval -p no:cacheprovider
	$(MAKE) --no-print-directory test-triton-next

test-kernels: setup
	$(PY) -m pytest -n 2 tests/ -m "not site"

test-notebooks: setup
	$(PY) -m pytest -n 2 --dist loadfile --nbval book/

# The newest Triton alone (it requires no other package; its interpreter uses .venv's numpy), in its own folder
# put first on PYTHONPATH, so that it shadows .venv's Triton for these runs only: an absolute path, since the
# notebooks' kernels start in book/. The first command checks that it is the Triton imported. The kernel tests
# and the notebooks run apart: the tests spread test by test over the workers (by file, as the notebooks must,
# they take half as long again).
WITH_NEXT := PYTHONPATH=$(CURDIR)/$(NEXT)

$(NEXT)/triton-$(TRITON_NEXT).dist-info: | $(VENV)/.installed
	rm -rf $(NEXT)
	$(PY) -m pip install -q --no-deps --target $(NEXT) "triton==$(TRITON_NEXT)"

test-triton-next: setup $(NEXT)/triton-$(TRITON_NEXT).dist-info
	$(WITH_NEXT) $(PY) -c "import sys, triton; v = triton.__version__; \
	  sys.exit(None if v == '$(TRITON_NEXT)' else f'imported triton {v} from {triton.__file__}, not $(TRITON_NEXT)')"
	$(WITH_NEXT) $(PY) -m pytest -n 2 tests/ -m "not site" -p no:cacheprovider
	$(WITH_NEXT) $(PY) -m pytest -n 2 --dist loadfile --nbval book/ -p no:cacheprovider

clean:
	rm -rf _build $(VENV) $(NEXT) _vendor/mathjax
