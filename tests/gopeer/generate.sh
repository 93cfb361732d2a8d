#!/usr/bin/env bash
# Regenerates the Go code of the interop peer from OUR .proto files (protocol/proto), the way
# upstream generates its own: protoc + protoc-gen-go + protoc-gen-go-grpc. cloudevents.proto is
# not generated: it maps to sdk-go's own package (binding/format/protobuf/v2/pb), as in upstream.
#
# Needs: protoc and the well-known protos (Debian packages protobuf-compiler, libprotobuf-dev), and the two plugins at the pinned versions:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.10
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.0
# Each generated file records the SHA-256 of the .proto it came from; the Go peer tests
# (tests/tests/gopeer_interop.rs) fail when a .proto changes without a rerun of this script.
set -euo pipefail
cd "$(dirname "$0")"
PROTO_DIR=../../protocol/proto
MOD=argocd-agent-rs/tests/gopeer/internal/pb
PATH="$(go env GOPATH)/bin:$PATH"
command -v protoc >/dev/null || { echo "protoc is missing: apt-get install protobuf-compiler" >&2; exit 1; }

# proto file -> Go package directory under internal/pb
declare -A PKGS=(
    [auth.proto]=authapi
    [eventstream.proto]=eventstreamapi
    [version.proto]=versionapi
    [logstream.proto]=logstreamapi
    [terminalstream.proto]=terminalstreamapi
)
maps=(--go_opt=Mcloudevents.proto=github.com/cloudevents/sdk-go/binding/format/protobuf/v2/pb
      --go-grpc_opt=Mcloudevents.proto=github.com/cloudevents/sdk-go/binding/format/protobuf/v2/pb)
for f in "${!PKGS[@]}"; do
    maps+=("--go_opt=M$f=$MOD/${PKGS[$f]}" "--go-grpc_opt=M$f=$MOD/${PKGS[$f]}")
done
rm -rf internal/pb
mkdir -p internal/pb
for f in "${!PKGS[@]}"; do
    out="internal/pb/${PKGS[$f]}"
    mkdir -p "$out"
    protoc -I "$PROTO_DIR" -I /usr/include --go_out="$out" --go_opt=paths=source_relative \
        --go-grpc_out="$out" --go-grpc_opt=paths=source_relative "${maps[@]}" "$f"
    sum=$(sha256sum "$PROTO_DIR/$f" | cut -c1-64)
    for g in "$out"/*.go; do
        { printf '// Generated from protocol/proto/%s by tests/gopeer/generate.sh: do not edit, rerun it.\n' "$f"
          printf '// proto-sha256: %s\n\n' "$sum"
          cat "$g"; } > "$g.tmp" && mv "$g.tmp" "$g"
    done
done
gofmt -l internal/pb
