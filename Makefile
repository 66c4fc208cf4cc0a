# make test  = install everything (venv, pip, Kafka jars, kcat, haproxy, chromium) and run the whole suite
#              (WORKERS xdist workers; the image is built beside the first tests, its tests wait for it)
# make test-fast = the in-process lane (codec, core harness, properties, units: no broker, S3, Spark or image)
# make check = ruff + mypy strict + the suite (what CI runs)
# make demo  = a real local Kafka (and tierproxy) with a kcat walk-through
# make kafka = one local Kafka broker on 127.0.0.1:$(KAFKA_PORT) in the foreground (the README's quickstart)
# make image = the container image the Helm chart deploys
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
WORKERS ?= 3
# the real parts a test may need (markers); the fast lane runs the tests needing none of them
PARTS := kafka or cluster or s3 or spark or image or registry or kcat
export TIERPROXY_CACHE ?= $(HOME)/.cache/tierproxy
# bytecode caches on: without them every test worker and every `tierproxy` process a test starts compiles the
# project (and pytest rewrites the tests) again
unexport PYTHONDONTWRITEBYTECODE
DEBIAN_PACKAGES := kcat haproxy chromium

.PHONY: install tools image test test-fast check lint typecheck demo kafka bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# uv resolves and installs the same versions as pip in a third of the time (42 s against 133 s on two cores, most
# of pip's being CPU); pip does it where uv cannot be had or fails
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@# a venv made before the distribution was renamed kafka-tierproxy holds this checkout as `tierproxy`: it goes
	@# first (uninstalled after, it would take the `tierproxy` script the new install wrote)
	-@$(BIN)/pip uninstall -q -y tierproxy >/dev/null 2>&1
	{ $(BIN)/pip install -q uv && $(BIN)/uv pip install -q --python $(BIN)/python -e '.[all,dev]'; } \
	  || $(BIN)/pip install -q -e '.[all,dev]'
	@# uv keeps each build of PySpark's source distribution (1.4 GB) as a revision of its own: the old ones go
	-@$(BIN)/uv cache prune -q 2>/dev/null
	touch $@

install: $(VENV)/.installed
	@{ command -v kcat && command -v chromium && { command -v haproxy || test -x /usr/sbin/haproxy; }; } \
	  >/dev/null 2>&1 || { \
	  echo "installing $(DEBIAN_PACKAGES) (Debian packages: haproxy balances the fleet tests' replicas, chromium" \
	       "loads the status page)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_PACKAGES)) >/dev/null \
	  || sudo sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_PACKAGES)' \
	  >/dev/null; }
	@command -v java >/dev/null 2>&1 || { echo "java (17+) is required"; exit 1; }
	@command -v javac >/dev/null 2>&1 || { echo "javac (a JDK 17+) is required: the tests compile Java sources"; exit 1; }
	$(BIN)/python -c "from tierproxy.dev.kafkadist import ensure_kafka_libs as e; print('kafka jars in', e())"
	$(BIN)/python -c "from tierproxy.dev.kafkadist import OTHER_VERSIONS as v, ensure_kafka_libs as e; \
	  print('kafka', ', '.join(v), 'jars in', ', '.join(str(e(x)) for x in v))"  # tests/test_kafka_versions.py

# helm, kubeconform, promtool and Kubernetes schemas for the chart tests (built with Go; the demo does not need them)
tools:
	bash .ci/install-tools.sh

# the container image localhost/tierproxy:<version> (buildah, chroot isolation, vfs; base from Debian packages)
image: | $(BIN)/python
	PY=$(BIN)/python bash .ci/image/build.sh

test: install tools
	@mkdir -p .pytest-artifacts
	@{ $(MAKE) --no-print-directory image >.pytest-artifacts/image.log 2>&1 \
	   || echo "make image failed (the image tests say why)" >>.pytest-artifacts/image.log; } &
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -n $(WORKERS) -m "not ($(PARTS) or process or bench)" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check protocol tierproxy tests

typecheck: install
	$(BIN)/mypy

# mypy (~25 s of one core) runs beside the suite's start, which leaves a core idle while its workers start; its
# output follows the suite's, and either failing fails the check
check: lint
	@mkdir -p .pytest-artifacts
	@{ $(BIN)/mypy >.pytest-artifacts/mypy.log 2>&1; echo $$? >.pytest-artifacts/mypy.rc; } & \
	  $(MAKE) --no-print-directory test; rc=$$?; wait; \
	  echo "$(BIN)/mypy (run beside the suite)"; cat .pytest-artifacts/mypy.log; \
	  test "$$rc" -eq 0 && test "$$(cat .pytest-artifacts/mypy.rc)" -eq 0

bench: install tools
	$(BIN)/python -m pytest -m bench tests/bench -s -p no:randomly $(PYTEST_ARGS)

demo: install
	$(BIN)/tierproxy demo

# its data stays in KAFKA_DIR between runs (the same cluster: a tier written against it stays its own)
KAFKA_PORT ?= 9092
KAFKA_DIR ?= /var/tmp/tierproxy/kafka
kafka: $(VENV)/.installed
	$(BIN)/python -m tierproxy.cli.devkafka --port $(KAFKA_PORT) --dir $(KAFKA_DIR)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
