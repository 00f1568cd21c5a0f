#!/usr/bin/env bash
# Build the krex distribution packages from the working tree:
#   build/pkg/krex_<version>-1_<arch>.deb   (debhelper + dh-python/pybuild)
#   build/pkg/krex-<version>-1.<arch>.rpm   (rpmbuild, packaging/rpm/krex.spec)
# then lint them (lintian, rpmlint) and fail on any finding not overridden.
#
#   packaging/build.sh [--no-install-deps] [--no-lint]
#
# The tree packaged is the working tree as git sees it: tracked files plus
# untracked files that are not ignored. CUDA_INCLUDE (default
# /usr/local/cuda/include) must hold cuda.h, as for `make`.
# Exit status: 0 built, 1 build or lint failure, 2 build tools unavailable.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# Distribution tools with the distribution's Python (/usr/bin/python3 sees
# python3-* packages; a python3 earlier on PATH, e.g. pyenv's, does not).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
out=$root/build/pkg
install_deps=1
lint=1
for arg in "$@"; do
    case "$arg" in
        --no-install-deps) install_deps=0 ;;
        --no-lint) lint=0 ;;
        *) echo "usage: $0 [--no-install-deps] [--no-lint]" >&2; exit 64 ;;
    esac
done

die() { echo "build.sh: $*" >&2; exit 1; }

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
