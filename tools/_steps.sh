# Shared by tools/*_check.sh (sourced, not run): step headers with elapsed time, failure
# messages that name the step, and removal of the script's scratch folder on exit.
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
