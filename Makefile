# The two commands that do everything on a fresh machine: `make demo` and `make test`.
PY := .venv/bin/python

.PHONY: install demo test proto bench clean

install:
	./install.sh

demo: install
	.venv/bin/sluice demo

# pytest exit 5 ("no tests ran") is a failure too: make propagates any non-zero exit.
test: install
	$(PY) -m pytest -p no:cacheprovider --durations=30 tests

proto: install
	$(PY) proto/gen.py

clean:
	rm -rf .venv
