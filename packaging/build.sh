#!/usr/bin/env bash
# Build the krex distribution packages from the working tree:
#   build/pkg/krex_<version>-1_<arch>.deb   (debhelper + dh-python/pybuild)
#   build/pkg/krex-<version>-1<dist>.<arch>.rpm   (rpmbuild, packaging/rpm/krex.spec)
# then lint them (lintian, rpmlint) and fail on any finding not overridden.
#
#   packaging/build.sh [--no-install-deps] [--no-lint] [--rpm-target NAME] [--rpm-python PATH]
#
# The .rpm is built for one RPM distribution of packaging/rpm/targets.toml
# (--rpm-target, default el9; `--rpm-target list` lists them): its own Python
# interpreter is the commands' shebang and the package's Requires. Its byte
# code is compiled by a Python of that interpreter's X.Y on this host:
# --rpm-python PATH, else /usr/bin/pythonX.Y, pythonX.Y on PATH, or pyenv's.
#
# The tree packaged is the working tree as git sees it: tracked files plus
# untracked files that are not ignored. CUDA_INCLUDE (default
# /usr/local/cuda/include) must hold cuda.h, as for `make`.
# Exit status: 0 built, 1 build or lint failure, 2 build tools unavailable.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# Distribution tools with the distribution's Python (/usr/bin/python3 sees
# python3-* packages; a python3 earlier on PATH, e.g. pyenv's, does not).
caller_path=$PATH
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
# The packages' byte code is compiled into the package tree, whatever the
# builder's environment says (a pycache prefix would move it out of the tree,
# e.g. make's test steps set one for the checkout).
unset PYTHONPYCACHEPREFIX PYTHONDONTWRITEBYTECODE
out=$root/build/pkg
install_deps=1
lint=1
rpm_target=el9
rpm_python=
usage="usage: $0 [--no-install-deps] [--no-lint] [--rpm-target NAME|list] [--rpm-python PATH]"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --no-install-deps) install_deps=0 ;;
        --no-lint) lint=0 ;;
        --rpm-target) [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 64; }; rpm_target=$2; shift ;;
        --rpm-python) [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 64; }; rpm_python=$2; shift ;;
        *) echo "$usage" >&2; exit 64 ;;
    esac
    shift
done

die() { echo "build.sh: $*" >&2; exit 1; }

targets=$root/packaging/rpm/targets.toml
if [[ $rpm_target == list ]]; then
    exec /usr/bin/python3 "$root/packaging/rpm/rpm_target.py" "$targets" --list
fi
mapfile -t rpm_target_args < <(/usr/bin/python3 "$root/packaging/rpm/rpm_target.py" "$targets" "$rpm_target")
[[ ${#rpm_target_args[@]} -gt 0 ]] || die "no RPM target $rpm_target (packaging/build.sh --rpm-target list)"
pyver=$(/usr/bin/python3 "$root/packaging/rpm/rpm_target.py" "$targets" "$rpm_target" \
    | sed -n 's/^python3_version //p')

# An interpreter of the target's X.Y, to compile the byte code; prints nothing if none.
reports_version() { [[ -x $1 ]] && [[ $("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) == "$pyver" ]]; }
find_rpm_python() {
    local c pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
    for c in "/usr/bin/python$pyver" "$(PATH=$caller_path command -v "python$pyver" || true)" \
        $(ls -d "$pyenv_root/versions/$pyver".*/bin/"python$pyver" 2>/dev/null | sort -V -r); do
        if [[ -n $c ]] && reports_version "$c"; then echo "$c"; return; fi
    done
}
if [[ -z $rpm_python ]]; then
    rpm_python=$(find_rpm_python)
    if [[ -z $rpm_python ]]; then
        echo "build.sh: RPM target $rpm_target needs a Python $pyver on this host to compile its" \
            "byte code (--rpm-python PATH)" >&2
        exit 2
    fi
elif ! reports_version "$rpm_python"; then
    die "--rpm-python $rpm_python is not a Python $pyver (target $rpm_target)"
fi

if [[ $install_deps -eq 1 ]]; then
    "$root/packaging/install-build-deps.sh" || exit 2
fi
export CUDA_INCLUDE=${CUDA_INCLUDE:-/usr/local/cuda/include}
[[ -f $CUDA_INCLUDE/cuda.h ]] || die "cuda.h not found in CUDA_INCLUDE=$CUDA_INCLUDE"

# One version everywhere: pyproject.toml, debian/changelog, the spec.
version=$(/usr/bin/python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$root/pyproject.toml")
deb_version=$(dpkg-parsechangelog -l "$root/packaging/deb/changelog" -S Version)
rpm_version=$(awk '$1 == "Version:" {print $2}' "$root/packaging/rpm/krex.spec")
[[ ${deb_version%-*} == "$version" ]] \
    || die "packaging/deb/changelog has $deb_version, pyproject.toml has $version"
[[ $rpm_version == "$version" ]] \
    || die "packaging/rpm/krex.spec has $rpm_version, pyproject.toml has $version"
client_version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/python_client/krex_client/__init__.py")
[[ $client_version == "$version" ]] \
    || die "python_client/krex_client/__init__.py has $client_version, pyproject.toml has $version"
for f in etc/krex.toml README.md docs/install.md docs/packaging.md; do
    [[ -f $root/$f ]] || die "$f is missing; the packages ship it"
done

rm -rf "$out"
mkdir -p "$out"
src=$out/src/krex-$version

# Copy the working tree (what git would commit), without build outputs.
mkdir -p "$src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$root" && git ls-files -z --cached --others --exclude-standard --deduplicate \
        | while IFS= read -r -d '' f; do if [[ -e $f ]]; then printf '%s\0' "$f"; fi; done \
        | tar --null --no-recursion -T - -cf -) | tar -xf - -C "$src"
else
    tar -C "$root" --exclude=./build --exclude=./.venv --exclude=./.git -cf - . \
        | tar -xf - -C "$src"
fi

# The rpm's source tarball, taken before any build writes into the tree.
top=$out/rpmbuild
mkdir -p "$top/SOURCES"
tar -C "$out/src" -czf "$top/SOURCES/krex-$version.tar.gz" "krex-$version"

# ---- .deb -------------------------------------------------------------------
cp -r "$root/packaging/deb" "$src/debian"
(cd "$src" && DEB_BUILD_OPTIONS="parallel=2 ${DEB_BUILD_OPTIONS:-}" \
    dpkg-buildpackage -b -us -uc) > "$out/deb-build.log" 2>&1 \
    || { tail -40 "$out/deb-build.log" >&2; die "dpkg-buildpackage failed (log: $out/deb-build.log)"; }
mv "$out"/src/*.deb "$out"/
rm -rf "$src/debian"

# ---- .rpm -------------------------------------------------------------------
rpmbuild -bb --nodeps \
    --define "_topdir $top" \
    "${rpm_target_args[@]}" \
    --define "krex_build_python /usr/bin/python3" \
    --define "krex_bytecompile_python $rpm_python" \
    --define "cuda_include $CUDA_INCLUDE" \
    --define "_smp_mflags -j2" \
    "$root/packaging/rpm/krex.spec" > "$out/rpm-build.log" 2>&1 \
    || { tail -40 "$out/rpm-build.log" >&2; die "rpmbuild failed (log: $out/rpm-build.log)"; }
find "$top/RPMS" -name '*.rpm' -exec mv {} "$out"/ \;

ls -1 "$out"/*.deb "$out"/*.rpm

# ---- lint -------------------------------------------------------------------
if [[ $lint -eq 1 ]]; then
    status=0
    # lintian reads overrides shipped in the package (packaging/deb/krex.lintian-overrides).
    lintian --fail-on error,warning --suppress-tags-from-file /dev/null "$out"/*.deb \
        || status=1
    rpmlint -r "$root/packaging/rpm/krex.rpmlintrc" "$out"/*.rpm || status=1
    [[ $status -eq 0 ]] || die "lint findings above (fix them or justify them in the overrides)"
fi
