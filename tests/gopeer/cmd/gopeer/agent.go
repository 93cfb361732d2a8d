package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"argocd-agent-rs/tests/gopeer/internal/pb/authapi"
	"argocd-agent-rs/tests/gopeer/internal/pb/eventstreamapi"
	"argocd-agent-rs/tests/gopeer/internal/pb/versionapi"
)

// upstreamAgentSource is the CloudEvent source upstream's agent stamps on everything it sends,
// whatever its mode or name.
const upstreamAgentSource = "agent://agent-managed"

func tlsFiles(certFile, keyFile, caFile string) (tls.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return cert, nil, fmt.Errorf("key pair: %w", err)
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return cert, nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return cert, nil, fmt.Errorf("no certificate in %s", caFile)
	}
	return cert, pool, nil
}

// runAgent plays upstream's agent: Authenticate (mtls, empty credentials), Version, then one
// Subscribe stream with the raw access token in `authorization`.
func runAgent(args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	server := fs.String("server", "", "principal address host:port")
	caFile := fs.String("ca", "", "CA certificate")
	certFile := fs.String("cert", "", "client certificate")
	keyFile := fs.String("key", "", "client key")
	mode := fs.String("mode", "managed", "managed or autonomous")
	version := fs.String("version", "", "AuthRequest.version (empty: an agent from before the handshake)")
	namespace := fs.String("namespace", "argocd", "AuthRequest.agentNamespace")
	compress := fs.Bool("compress", false, "gzip every call, as upstream's --enable-compression (pkg/client/remote.go)")
	logLines := fs.Int("log-lines", 3, "lines each containerlog request is answered with (upstream's StreamLogs)")
	websocket := fs.Bool("websocket", false, "gRPC over WebSocket, as upstream's --enable-websocket (grpc-http1's ConnectViaProxy with UseWebSocket)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cert, pool, err := tlsFiles(*certFile, *keyFile, *caFile)
	if err != nil {
		return err
	}
	tlsConfig := &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}
	opts := []grpc.DialOption{grpc.WithUserAgent("argocd-agent/v0.0.1")}
	if *compress {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.UseCompressor(gzip.Name)))
	}
	var conn *grpc.ClientConn
	if *websocket {
		c, stop, err := connectViaWSProxy(*server, tlsConfig, opts...)
		if err != nil {
			return err
		}
		defer stop()
		conn = c
	} else {
		c, err := grpc.NewClient(*server, append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig)))...)
		if err != nil {
			return err
		}
		defer c.Close()
		conn = c
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	actx, acancel := context.WithTimeout(ctx, 30*time.Second)
	resp, err := authapi.NewAuthenticationClient(conn).Authenticate(actx, &authapi.AuthRequest{
		Method: "mtls", Credentials: map[string]string{}, Mode: *mode, Version: *version, AgentNamespace: *namespace,
	})
	acancel()
	if err != nil {
		st, _ := status.FromError(err)
		out.report(map[string]any{"kind": "auth_error", "code": st.Code().String(), "message": st.Message()})
		return nil
	}
	// An agent with the version handshake (upstream PR #757) sends its bare build version and
	// takes the principal's AuthResponse.version as the principal's build version; its
	// principal compares versions byte for byte, so this peer holds the answer to the same
	// rule: anything but its own version ends the connection.
	if *version != "" && resp.GetVersion() != *version {
		out.report(map[string]any{"kind": "version_refused", "principal_version": resp.GetVersion(), "agent_version": *version})
		return nil
	}
	out.report(map[string]any{"kind": "authenticated", "principal_version": resp.GetVersion(), "principal_namespace": resp.GetPrincipalNamespace()})
	vr, err := versionapi.NewVersionClient(conn).Version(ctx, &versionapi.VersionRequest{})
	if err != nil {
		return fmt.Errorf("Version: %w", err)
	}
	out.report(map[string]any{"kind": "version", "version": vr.GetVersion()})

	sctx := metadata.AppendToOutgoingContext(ctx, "authorization", resp.GetAccessToken())
	stream, err := eventstreamapi.NewEventStreamClient(conn).Subscribe(sctx)
	if err != nil {
		return fmt.Errorf("Subscribe: %w", err)
	}
	side := &sessions{ctx: ctx, conn: conn, token: resp.GetAccessToken(), lines: *logLines}
	p := &peer{role: "agent", source: upstreamAgentSource, stream: stream, onEvent: side.onEvent}
	out.report(map[string]any{"kind": "subscribed"})
	go p.receive(ctx, stream)
	commands(p.handleSend)
	_ = stream.CloseSend()
	return nil
}
