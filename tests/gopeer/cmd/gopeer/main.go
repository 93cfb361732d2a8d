// Command argocd-gopeer plays an upstream argocd-agent peer, written on the libraries upstream
// uses at upstream's pinned versions (google.golang.org/grpc, cloudevents sdk-go v2.16.2 and
// its protobuf format), against our Rust principal and agent. It is driven by the Rust tests
// (tests/tests/gopeer_interop.rs) over JSON lines: commands on stdin, reports on stdout, logs on
// stderr.
//
//	argocd-gopeer agent --server 127.0.0.1:PORT --ca ca.crt --cert a.crt --key a.key --mode managed --version V [--compress]
//	argocd-gopeer principal --cert p.crt --key p.key --ca ca.crt --version V
//	argocd-gopeer codec
//	argocd-gopeer check-protos protocol/proto
//	argocd-gopeer argocd-redis --server-redis 127.0.0.1:PORT [--controller-redis 127.0.0.1:PORT]
//
// Every event received is decoded with sdk-go's FromProto, dispatched on its target the way
// upstream's internal/event package does, its payload decoded into upstream-shaped structs, and
// reported; it is ACKed as upstream's agent and principal ACK.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: argocd-gopeer agent|principal|codec|check-protos|argocd-redis [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "agent":
		err = runAgent(os.Args[2:])
	case "principal":
		err = runPrincipal(os.Args[2:])
	case "codec":
		err = runCodec(os.Args[2:])
	case "check-protos":
		err = runCheckProtos(os.Args[2:])
	case "argocd-redis":
		err = runArgoCDRedis(os.Args[2:])
	default:
		err = fmt.Errorf("unknown role %q: want agent, principal, codec, check-protos or argocd-redis", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "argocd-gopeer:", err)
		os.Exit(1)
	}
}
