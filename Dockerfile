# roost in a container: a static binary on an empty base, run as a user
# that is not root, its health asked by roost itself.
#
#   docker build -t roost .                    # builds from source (needs the golang image)
#   docker build --target prebuilt -t roost .  # takes dist/roost-linux-$TARGETARCH from .ci/release.sh
#
# A container's listener is not loopback, so the node needs apps: give it a
# registry (ROOST_DATABASE_URL, or ROOST_APPS on a volume) or ROOST_APP_SECRET.
# compose.yaml runs two nodes with PostgreSQL and Redis. docs/operations.md,
# "Packages", says more.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# .git stays out of the build context (.dockerignore): name the build with
# --build-arg VERSION=v1.2.0 --build-arg REVISION=$(git rev-parse HEAD).
ARG VERSION=""
ARG REVISION=""
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
    -ldflags "-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/roost .

# What both runtime images share: no shell, no libc, nothing but roost.
FROM scratch AS base
ENV ROOST_LISTEN=0.0.0.0:8080 \
    ROOST_API=0.0.0.0:8090 \
    ROOST_ADMIN=0.0.0.0:6060 \
    ROOST_LOG_FORMAT=json
EXPOSE 8080 8090 6060
# 65532: the conventional "nonroot" id. Nothing in the image is writable:
# an apps file (ROOST_APPS) goes on a volume the user may write.
USER 65532:65532
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/roost", "health"]
ENTRYPOINT ["/usr/local/bin/roost"]
CMD ["serve"]

# The binary of .ci/release.sh (dist/roost-linux-amd64 or -arm64), for a
# machine that builds without pulling a Go image.
FROM base AS prebuilt
ARG TARGETARCH=amd64
COPY dist/roost-linux-${TARGETARCH} /usr/local/bin/roost

# The default: built from source here.
FROM base AS runtime
COPY --from=build /out/roost /usr/local/bin/roost
