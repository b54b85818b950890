# Shared by tools/*_check.sh (sourced, not run): step headers with elapsed time, failure
# messages that name the step, removal of the script's scratch folder on exit, and the copy of
# the source tree that the sanitizer, valgrind and wheel checks build from.
# The sourcing script sets check_name first; it may set `work` to a folder to remove on exit.
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
