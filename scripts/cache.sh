# shellcheck shell=bash
# Sourced by scripts/test-deps.sh and scripts/cuda-toolkit.sh: the per-user cache of the set-up
# that does not depend on the clone (the test venv, the npm packages, native llama.cpp and the
# model files, NVIDIA's wheels and the CUDA check's cargo target dir), so that a second clone
# on the same machine (CI clones afresh every time) reuses it instead of rebuilding it under
# its own target/.
#
#   AGENTD_CACHE   the cache root; unset: ${XDG_CACHE_HOME:-$HOME/.cache}/agentd-ci.
#                  Empty (AGENTD_CACHE=) or "off": no cache, everything under target/ as before.
#
# Each entry is named by a key (cache_key: sha256 of its pins and of the tools that build it),
# so a change of pins makes a new entry and never reuses a stale one; old entries stay until
# the cache is removed (rm -rf ~/.cache/agentd-ci: everything in it is rebuilt on the next
# run). An entry is filled under a lock (flock on ENTRY.lock), so two runs at once wait for
# each other rather than fill it twice. A root that cannot be created or written falls back
# to target/ with a message.

# Sets cache_root to the usable cache root, or to "" when the cache is off or unwritable.
cache_init() {
    [ -n "${cache_checked:-}" ] && return 0
    cache_checked=1
    cache_root="${AGENTD_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/agentd-ci}"
    case "$cache_root" in
    "" | off) cache_root="" && return 0 ;;
    esac
    local probe
    if mkdir -p "$cache_root" 2>/dev/null && probe="$(mktemp "$cache_root/.probe.XXXXXX" 2>/dev/null)"; then
        rm -f "$probe"
        cache_root="$(cd "$cache_root" && pwd)"
        [ -f "$cache_root/CACHEDIR.TAG" ] ||
            printf 'Signature: 8a477f597d28d172789f06886806bc55\n# agentd test set-up cache (scripts/cache.sh)\n' \
                >"$cache_root/CACHEDIR.TAG"
    else
        echo "  the cache $cache_root cannot be written: using target/ (set AGENTD_CACHE to a writable folder, or AGENTD_CACHE= to turn the cache off)" >&2
        cache_root=""
    fi
}

# cache_path NAME FALLBACK: the entry NAME in the cache root, or FALLBACK without a cache.
cache_path() {
    cache_init
    if [ -n "$cache_root" ]; then printf '%s\n' "$cache_root/$1"; else printf '%s\n' "$2"; fi
}

# cache_key STRING...: 12 hex digits of the sha256 of the strings (an entry's name suffix).
cache_key() { printf '%s\n' "$@" | sha256sum | cut -c1-12; }

# cache_lock DIR: an exclusive lock on DIR.lock, held until cache_unlock (or the shell's exit).
# No flock: no lock.
cache_lock() {
    command -v flock >/dev/null || return 0
    mkdir -p "$(dirname "$1")"
    exec {cache_lock_fd}>"$1.lock" || return 0
    if ! flock -n "$cache_lock_fd"; then
        echo "  waiting for another run that is filling $1"
        flock "$cache_lock_fd"
    fi
}

cache_unlock() {
    if [ -n "${cache_lock_fd:-}" ]; then
        exec {cache_lock_fd}>&-
        cache_lock_fd=""
    fi
}

# Once, where this file is sourced, so the message about an unwritable root comes once and
# cache_path's callers in $(...) find cache_root set.
cache_init
