# Shared by tools/*_check.sh (sourced, not run): step headers with elapsed time, failure
# messages that name the step, removal of the script's scratch folder on exit, the command-line
# options and output folder of the build checks, the staged copy of the source tree that the
# sanitizer, valgrind, wheel and QEMU checks build from, their fresh virtual environments, and
# the run of the tests from a folder that holds only a copy of tests/.
# The sourcing script sets check_name first (and py, the interpreter, before fresh_venv); it may
# set `work` to a folder to remove on exit.
# shellcheck shell=bash
: "${check_name:?set check_name before sourcing tools/_steps.sh}"
start=$SECONDS
current=""
step() { current=$*; echo; echo "== $check_name: $* (t=$((SECONDS - start))s)"; }
fail() { echo "$check_name: FAILED: $*" >&2; exit 1; }
on_exit() {
    local rc=$?
    [ "$rc" -eq 0 ] || echo "$check_name: FAILED in step: ${current:-setup} (exit $rc)" >&2
    [ -z "${work:-}" ] || rm -rf "$work"
}
trap on_exit EXIT

# Pinned so that a new release cannot change the verdict on the same tree.
# shellcheck disable=SC2034  # used by the sourcing scripts
build_pin=build==1.6.1

# print_help: the calling script's header comment (its lines 2 up to `set -euo pipefail`).
print_help() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# usage_error MESSAGE: a wrong command line: the message, exit status 2 (not a failed check).
usage_error() { echo "$check_name: $*" >&2; trap - EXIT; exit 2; }

# parse_args ARG...: the options of the build checks: --outdir DIR (sets out) and -h/--help.
# A script with options of its own defines own_option, which takes one option (returning 0) or
# returns 1; any other argument is a usage error.
parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --outdir) [ $# -ge 2 ] || usage_error "--outdir needs a folder"; out=$2; shift 2 ;;
            -h|--help) print_help; exit 0 ;;
            *) if declare -F own_option >/dev/null && own_option "$1"; then shift
               else usage_error "unknown argument $1 (see --help)"; fi ;;
        esac
    done
}

# set_outdir NAME [keep]: `out` (from --outdir) is created if missing and made absolute;
# without --outdir, out is a new temporary folder cyattn-NAME.XXXXXX, removed on exit unless
# `keep` is given.
set_outdir() {
    if [ -n "${out:-}" ]; then
        mkdir -p "$out" && out=$(cd "$out" && pwd)
    else
        out=$(mktemp -d "${TMPDIR:-/tmp}/cyattn-$1.XXXXXX")
        [ "${2:-}" = keep ] || work=$out
    fi
}

# stage_source_tree ROOT DEST: copy the project's source files from ROOT into DEST/src and
# list them in DEST/source-files.txt. In a git checkout: the tracked files plus new files that
# .gitignore does not exclude (so build products never leak in); elsewhere every file but
# build products, caches and generated C.
stage_source_tree() {
    local root=$1 dest=$2
    mkdir -p "$dest/src"
    if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        (cd "$root" && git ls-files -z --cached --others --exclude-standard) |
            while IFS= read -r -d '' f; do [ -f "$root/$f" ] && printf '%s\n' "$f"; done |
            sort -u > "$dest/source-files.txt"
    else
        (cd "$root" && find . -type f ! -path './build/*' ! -path './dist/*' \
            ! -path '*/__pycache__/*' ! -path './.git/*' ! -name '*.so' ! -name '*.pyd' \
            ! -name '*.c' | sed 's|^\./||') | sort -u > "$dest/source-files.txt"
    fi
    (cd "$root" && tr '\n' '\0' < "$dest/source-files.txt" | xargs -0 cp --parents -t "$dest/src")
}

# stage_step [FOLDER...]: the step that stages $root's source tree in $out/src, after removing
# $out/src and $out/FOLDER for each FOLDER (what an earlier run with the same --outdir left).
stage_step() {
    step "stage the source tree in $out/src"
    local d
    rm -rf "$out/src"
    for d in "$@"; do rm -rf "${out:?}/$d"; done
    stage_source_tree "$root" "$out"
    echo "staged $(wc -l < "$out/source-files.txt") files"
}

# fresh_venv DIR: a new virtual environment of $py in DIR; vpy is its python.
fresh_venv() { "${py:?set py before fresh_venv}" -m venv "$1"; vpy=$1/bin/python; }

# pip_install_staged LOG [VAR=VALUE | -u VAR]...: pip install the staged copy ($out/src) with
# the test dependencies into vpy's venv, in the environment env(1) makes of the arguments;
# pip's output goes to LOG; prints setup.py's compiler line.
pip_install_staged() {
    local log=$1
    shift
    env "$@" "$vpy" -m pip install --verbose --disable-pip-version-check --no-cache-dir \
        "$out/src[test]" > "$log" 2>&1 ||
        { tail -40 "$log"; fail "pip install of the staged copy (log: $log)"; }
    grep -E "cyattn: compiler=" "$log" | sed 's/^ *//' | sort -u
}

# pip_install_wheel WHEEL LOG: pip install WHEEL with the test dependencies into vpy's venv
# (pip's output in LOG) and import it.
pip_install_wheel() {
    "$vpy" -m pip install --quiet --disable-pip-version-check "${1}[test]" > "$2" 2>&1 ||
        { cat "$2"; fail "pip install of $(basename "$1")"; }
    grep -v "^WARNING: Location 'file:" "$2" || true   # drop a pip index note of this machine
    "$vpy" -c "import cyattn" || fail "the installed wheel does not import (natively)"
}

# show_versions: the versions of cyattn, NumPy, torch (if installed) and the test tools in
# vpy's venv.
show_versions() {
    "$vpy" -m pip list --disable-pip-version-check --format=freeze 2>/dev/null |
        grep -E -i "^(cyattn|numpy|torch|pytest|hypothesis|threadpoolctl|ml.dtypes)==" || true
}

# enter_tests_copy TESTS RUN: cd into a new folder RUN that holds only a copy of the folder
# TESTS (as RUN/tests), so that the tests import the installed cyattn, never a source tree.
enter_tests_copy() {
    mkdir -p "$2"
    cp -r "$1" "$2/tests"
    find "$2" -name __pycache__ -prune -exec rm -rf {} +
    cd "$2" || fail "cd $2"
}

# assert_venv_cyattn: vpy imports cyattn from its venv's site-packages (not from a source
# tree); prints where, and the kernel variants.
assert_venv_cyattn() {
    "$vpy" - "${vpy%/bin/python}" <<'EOF'
import os, sys, cyattn
where = os.path.realpath(cyattn.__file__)
venv = os.path.realpath(sys.argv[1])
print(f"cyattn imported from {where}; variants: {cyattn._backend.available_variants()}")
if not where.startswith(venv + os.sep):
    sys.exit(f"cyattn was not imported from the venv's site-packages ({venv})")
EOF
}

# pytest_summary LOG: pytest's last summary line in LOG ("N passed, ... in Ts"), or nothing.
pytest_summary() {
    grep -E "^=* *[0-9]+ (passed|failed|skipped|errors?|deselected)\b.* in [0-9.]+s" "$1" |
        tail -1 | sed 's/^=* *//; s/ *=*$//' || true
}
