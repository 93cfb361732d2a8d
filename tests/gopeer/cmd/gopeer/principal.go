package main

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha512"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"regexp"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	// Registered as upstream's principal registers it (principal/listen.go): a gzip-compressing
	// agent is read, and answered in gzip.
	_ "google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"argocd-agent-rs/tests/gopeer/internal/pb/authapi"
	"argocd-agent-rs/tests/gopeer/internal/pb/eventstreamapi"
	"argocd-agent-rs/tests/gopeer/internal/pb/versionapi"
)

// principalServer plays upstream's principal for one agent: it issues RS512 JWTs whose subject
// is {"clientID":..,"mode":..}, answers Version, and runs Subscribe streams.
type principalServer struct {
	authapi.UnimplementedAuthenticationServer
	versionapi.UnimplementedVersionServer
	eventstreamapi.UnimplementedEventStreamServer

	version string
	key     *rsa.PrivateKey
	peer    *peer
	// uriRegex: authenticate as upstream's mtls:uri:<regex> (-auth-uri-regex).
	uriRegex *regexp.Regexp
	// streams counts Subscribe calls (a reconnect is a new one).
	mu      sync.Mutex
	streams int
}

func (s *principalServer) token(agent, mode, aud string, ttl time.Duration) (string, error) {
	enc := base64.RawURLEncoding
	sub, _ := json.Marshal(map[string]string{"clientID": agent, "mode": mode})
	now := time.Now()
	header, _ := json.Marshal(map[string]string{"alg": "RS512", "typ": "JWT"})
	claims, _ := json.Marshal(map[string]any{
		"iss": "argocd-agent-server", "sub": string(sub), "aud": aud,
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(ttl).Unix(), "jti": fmt.Sprint(now.UnixNano()),
	})
	signing := enc.EncodeToString(header) + "." + enc.EncodeToString(claims)
	digest := sha512.Sum512([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, s.key, crypto.SHA512, digest[:])
	if err != nil {
		return "", err
	}
	return signing + "." + enc.EncodeToString(sig), nil
}

// Authenticate checks the mode and the mTLS identity (the leaf's CN), as upstream's
// `mtls:subject:CN=(...)`.
func (s *principalServer) Authenticate(ctx context.Context, req *authapi.AuthRequest) (*authapi.AuthResponse, error) {
	if req.GetMode() != "managed" && req.GetMode() != "autonomous" {
		return nil, fmt.Errorf("unknown or missing operation mode: '%s'", req.GetMode())
	}
	agent := s.agentOf(ctx, req.GetMethod())
	if agent == "" {
		return nil, status.Error(codes.Unauthenticated, "authentication failed")
	}
	// Upstream's version handshake (v0.8.0 on, principal/apis/auth/auth.go): no version is
	// InvalidArgument, any but the principal's own bare version FailedPrecondition.
	if s.version != "" && req.GetVersion() != s.version {
		out.report(map[string]any{"kind": "version_mismatch", "agent": agent, "version": req.GetVersion()})
		if req.GetVersion() == "" {
			return nil, status.Error(codes.InvalidArgument, "agent version is required")
		}
		return nil, status.Error(codes.FailedPrecondition, "version mismatch")
	}
	out.report(map[string]any{"kind": "authenticate", "agent": agent, "mode": req.GetMode(), "version": req.GetVersion(), "agent_namespace": req.GetAgentNamespace(), "method": req.GetMethod()})
	access, err := s.token(agent, req.GetMode(), "argocd-agent-server-access", 5*time.Minute)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	refresh, err := s.token(agent, req.GetMode(), "argocd-agent-server-refresh", 24*time.Hour)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &authapi.AuthResponse{AccessToken: access, RefreshToken: refresh, Version: s.version, PrincipalNamespace: "argocd"}, nil
}

func (s *principalServer) Version(context.Context, *versionapi.VersionRequest) (*versionapi.VersionResponse, error) {
	return &versionapi.VersionResponse{Version: "argocd-agent-" + s.version}, nil
}

// Subscribe requires a token in `authorization`, then becomes the stream the test drives.
func (s *principalServer) Subscribe(stream eventstreamapi.EventStream_SubscribeServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	if len(md.Get("authorization")) == 0 {
		return status.Error(codes.Unauthenticated, "no token")
	}
	s.mu.Lock()
	s.streams++
	n := s.streams
	s.mu.Unlock()
	s.peer.mu.Lock()
	s.peer.stream = stream
	s.peer.mu.Unlock()
	out.report(map[string]any{"kind": "subscribed", "agent": peerCN(stream.Context()), "stream": n})
	s.peer.receive(stream.Context(), stream)
	return nil
}

// agentOf is the agent a call authenticates as: the leaf's CN, or with -auth-uri-regex (upstream
// v0.10's SPIRE principal, `mtls:uri:spiffe://[^/]+/(.+)`) capture group 1 of the regex on the
// verified leaf's URI SANs, for method "mtls" only (upstream's principal knows no other method
// then), and a DNS label as upstream's NameIsDNSLabel check.
func (s *principalServer) agentOf(ctx context.Context, method string) string {
	if s.uriRegex == nil {
		return peerCN(ctx)
	}
	info, ok := credentialsFromContext(ctx)
	if method != "mtls" || !ok || len(info.State.VerifiedChains) == 0 {
		return ""
	}
	for _, uri := range info.State.VerifiedChains[0][0].URIs {
		if m := s.uriRegex.FindStringSubmatch(uri.String()); len(m) >= 2 && dnsLabel.MatchString(m[1]) {
			return m[1]
		}
	}
	return ""
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

func peerCN(ctx context.Context) string {
	info, ok := credentialsFromContext(ctx)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return ""
	}
	return info.State.PeerCertificates[0].Subject.CommonName
}

// runPrincipal listens on 127.0.0.1:0 with mTLS and prints {"kind":"listening","addr":..}.
func runPrincipal(args []string) error {
	fs := flag.NewFlagSet("principal", flag.ContinueOnError)
	caFile := fs.String("ca", "", "CA certificate (client certificates are verified against it)")
	certFile := fs.String("cert", "", "server certificate")
	keyFile := fs.String("key", "", "server key")
	version := fs.String("version", "", "AuthResponse.version")
	uriRegex := fs.String("auth-uri-regex", "", "authenticate as upstream's mtls:uri:<regex> (method mtls, URI SAN) instead of by CN")
	websocket := fs.Bool("websocket", false, "serve as upstream's principal with --enable-websocket (grpc-http1's downgrading handler)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cert, pool, err := tlsFiles(*certFile, *keyFile, *caFile)
	if err != nil {
		return err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	tlsConfig := &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsConfig)))
	ps := &principalServer{version: *version, key: key, peer: &peer{role: "principal", source: ""}}
	if *uriRegex != "" {
		if ps.uriRegex, err = regexp.Compile(*uriRegex); err != nil {
			return err
		}
	}
	authapi.RegisterAuthenticationServer(srv, ps)
	versionapi.RegisterVersionServer(srv, ps)
	eventstreamapi.RegisterEventStreamServer(srv, ps)
	if *websocket {
		httpSrv := serveDowngrading(lis, srv, tlsConfig)
		defer httpSrv.Close()
	} else {
		go func() { _ = srv.Serve(lis) }()
	}
	out.report(map[string]any{"kind": "listening", "addr": lis.Addr().String()})
	commands(ps.peer.handleSend)
	srv.Stop()
	return nil
}
