# Multi-stage build of the node daemon and rdmactl: static binaries on a
# distroless base. Build with `make image` where a Docker engine runs.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION
ARG COMMIT
RUN CGO_ENABLED=0 go build -trimpath -o /out/ \
    -ldflags="-s -w -X github.com/rdma-dra/rdma-dra-driver/internal/buildinfo.version=${VERSION:-$(cat VERSION)} -X github.com/rdma-dra/rdma-dra-driver/internal/buildinfo.commit=${COMMIT}" \
    ./cmd/...

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/bin/
# The daemon needs root on the node (kubelet sockets, /dev, CDI dir); the
# Helm chart sets runAsUser 0 and drops every capability it does not need.
USER 0
ENTRYPOINT ["/usr/bin/rdma-dra-driver"]
