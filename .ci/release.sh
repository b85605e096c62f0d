#!/usr/bin/env bash
# Release binaries: static linux/amd64 and linux/arm64 builds of roost and
# their SHA-256 checksums.
#
#   .ci/release.sh [VERSION [OUTDIR]]    # default: git describe, ./dist
#
# Writes OUTDIR/roost-linux-amd64, OUTDIR/roost-linux-arm64 and
# OUTDIR/SHA256SUMS (check with: cd OUTDIR && sha256sum -c SHA256SUMS).
# CGO_ENABLED=0: the binaries need no libc and run on any Linux of the
# architecture, and in a scratch or distroless image. `roost version`
# names VERSION, the commit and its time (given with -X, so a build from a
# source tarball without .git still names them when passed in the
# environment as ROOST_REVISION and ROOST_BUILD_TIME).
set -euo pipefail
cd "$(dirname "$0")/.."

version="${1:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}"
out="${2:-dist}"
revision="${ROOST_REVISION:-$(git rev-parse HEAD 2>/dev/null || true)}"
built="${ROOST_BUILD_TIME:-$(TZ=UTC git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd 2>/dev/null || true)}"

mkdir -p "$out"
for arch in amd64 arm64; do
  echo "release: roost-linux-$arch ($version)" >&2
  CGO_ENABLED=0 GOOS=linux GOARCH="$arch" go build -trimpath -buildvcs=false \
    -ldflags "-s -w -X main.version=$version -X main.revision=$revision -X main.buildTime=$built" \
    -o "$out/roost-linux-$arch" .
done
(cd "$out" && sha256sum roost-linux-amd64 roost-linux-arm64 > SHA256SUMS)
cat "$out/SHA256SUMS" >&2
