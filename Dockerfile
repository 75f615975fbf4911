# One image with every Skipper binary at /<binary>; manifests pick one with
# `command:` (see deploy/base):
#   /skipper-controller   the controller (runs as non-root)
#   /skipper-noderouter   the node router (DaemonSet; needs the capabilities
#                         in deploy/base/noderouter.yaml for BPF and addresses)
#   /skipper-echo         the reference function runtime for pools
#   /skipper-agent        the instance contract beside any image (a pool pod's
#                         native sidecar)
# Build: docker build -t ghcr.io/skipper-dev/skipper:v0.1.0 .
# The flags below are the same as `make build` (a test keeps them equal).

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY cmd ./cmd
COPY controller ./controller
COPY noderouter ./noderouter
COPY proto ./proto
COPY bpf ./bpf
COPY internal ./internal
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/ ./cmd/skipper-controller ./cmd/skipper-noderouter ./cmd/skipper-echo ./cmd/skipper-agent

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /
USER 65532:65532
ENTRYPOINT ["/skipper-controller"]
