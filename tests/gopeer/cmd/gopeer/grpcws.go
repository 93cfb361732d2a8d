package main

// gRPC over WebSocket as upstream's --enable-websocket speaks it: the behaviour of
// golang.stackrox.io/grpc-http1 (client.ConnectViaProxy with client.UseWebSocket(true) on the
// agent, server.CreateDowngradingHandler on the principal), written here on the same WebSocket
// library (github.com/coder/websocket) because the Go module proxy this project reaches does not
// serve golang.stackrox.io. The wire follows that library:
//
//   - one WebSocket per call: GET <method path>, subprotocol "grpc-ws", the call's request
//     headers (metadata included) as the upgrade request's headers, no permessage-deflate, a
//     64 MiB read limit;
//   - every message is binary and one whole gRPC frame (5-byte prefix and payload);
//   - client to server: the request messages, then the end of stream {0x80,0,0,0,0};
//   - server to client: a metadata frame (flag 0x80) with the response headers as
//     http.Header.Write writes them, the messages, then a metadata frame with the trailers; a
//     first frame that already has Grpc-Status is a trailers-only answer; then a close (1000);
//   - the server's Accept names no subprotocol in its answer.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"sync"

	"github.com/coder/websocket"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	wsSubprotocol  = "grpc-ws"
	wsReadLimit    = 64 << 20
	frameHeaderLen = 5
	metadataFlag   = 0x80
	compressedFlag = 0x01
)

var endOfStream = []byte{metadataFlag, 0, 0, 0, 0}

func frameHeader(flags byte, n int) []byte {
	h := make([]byte, frameHeaderLen)
	h[0] = flags
	binary.BigEndian.PutUint32(h[1:], uint32(n))
	return h
}

func validateFrame(msg []byte) error {
	if len(msg) < frameHeaderLen {
		return fmt.Errorf("message of %d bytes is shorter than a gRPC frame prefix", len(msg))
	}
	if n := binary.BigEndian.Uint32(msg[1:frameHeaderLen]); int(n) != len(msg)-frameHeaderLen {
		return fmt.Errorf("frame announces %d bytes, carries %d", n, len(msg)-frameHeaderLen)
	}
	return nil
}

// wsWrite sends every length-prefixed message read from r as one binary WebSocket message.
func wsWrite(ctx context.Context, conn *websocket.Conn, r io.Reader) error {
	for {
		var msg bytes.Buffer
		if _, err := io.CopyN(&msg, r, frameHeaderLen); err != nil {
			if err == io.EOF && msg.Len() == 0 {
				return nil
			}
			return err
		}
		n := binary.BigEndian.Uint32(msg.Bytes()[1:])
		if _, err := io.CopyN(&msg, r, int64(n)); err != nil {
			return io.ErrUnexpectedEOF
		}
		if err := conn.Write(ctx, websocket.MessageBinary, msg.Bytes()); err != nil {
			return err
		}
	}
}

// === server: the downgrading handler ===

// downgradingHandler serves native gRPC (HTTP/2) with grpcSrv.ServeHTTP and gRPC-WebSocket
// upgrades on the same port, as grpc-http1's CreateDowngradingHandler (without its gRPC-Web
// branch, which upstream's agent never uses with websocket on).
func downgradingHandler(grpcSrv *grpc.Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Sec-Websocket-Protocol") == wsSubprotocol {
			if !strings.EqualFold(r.Header.Get("Connection"), "upgrade") {
				http.Error(w, "missing 'Connection: Upgrade' header in gRPC-websocket request", http.StatusBadRequest)
				return
			}
			if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
				http.Error(w, "missing 'Upgrade: websocket' header in gRPC-websocket request", http.StatusBadRequest)
				return
			}
			serveWS(w, r, grpcSrv)
			return
		}
		if strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") && r.ProtoMajor == 2 {
			grpcSrv.ServeHTTP(w, r)
			return
		}
		http.NotFound(w, r)
	})
}

func serveWS(w http.ResponseWriter, r *http.Request, grpcSrv *grpc.Server) {
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	conn.SetReadLimit(wsReadLimit)
	ctx := r.Context()
	req := r.Clone(ctx)
	req.ProtoMajor, req.ProtoMinor, req.Proto = 2, 0, "HTTP/2.0"
	req.Method = http.MethodPost
	req.Header.Del("Connection")
	req.Header.Del("Upgrade")
	for k := range req.Header {
		if strings.HasPrefix(k, "Sec-Websocket-") {
			delete(req.Header, k)
		}
	}
	req.Header.Del("Content-Length")
	req.ContentLength = -1
	req.Body = &wsReader{ctx: ctx, conn: conn}

	pr, pw := io.Pipe()
	rw := &wsResponseWriter{w: pw, header: make(http.Header)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := wsWrite(ctx, conn, pr); err != nil {
			_ = conn.Close(websocket.StatusInternalError, err.Error())
		}
	}()
	grpcSrv.ServeHTTP(rw, req)
	if err := rw.Close(); err != nil {
		_ = conn.Close(websocket.StatusInternalError, err.Error())
	}
	wg.Wait()
	_ = conn.Close(websocket.StatusNormalClosure, "")
}

// wsReader is the request body: one gRPC frame per WebSocket message until the end of stream.
type wsReader struct {
	ctx  context.Context
	conn *websocket.Conn
	msg  []byte
	err  error
}

func (r *wsReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if len(r.msg) == 0 {
		typ, msg, err := r.conn.Read(r.ctx)
		switch {
		case err != nil:
			r.err = err
		case typ != websocket.MessageBinary:
			r.err = fmt.Errorf("expected a binary message, got %v", typ)
		case bytes.Equal(msg, endOfStream):
			r.err = io.EOF
		default:
			if r.err = validateFrame(msg); r.err == nil && msg[0]&metadataFlag != 0 {
				r.err = errors.New("metadata frame from the client")
			}
		}
		if r.err != nil {
			return 0, r.err
		}
		r.msg = msg
	}
	n := copy(p, r.msg)
	r.msg = r.msg[n:]
	return n, nil
}

func (r *wsReader) Close() error {
	_ = r.conn.CloseRead(r.ctx)
	return nil
}

// wsResponseWriter turns grpc-go's ServeHTTP output into frames: the headers as a metadata
// frame, the body as is, the trailers (announced or Trailer:-prefixed) as a metadata frame.
type wsResponseWriter struct {
	w             io.WriteCloser
	header        http.Header
	headerWritten bool
	announced     []string
}

func (w *wsResponseWriter) Header() http.Header { return w.header }

func (w *wsResponseWriter) Write(p []byte) (int, error) {
	if !w.headerWritten {
		w.WriteHeader(http.StatusOK)
	}
	return w.w.Write(p)
}

func (w *wsResponseWriter) WriteHeader(int) {
	if w.headerWritten {
		return
	}
	w.announced = append([]string{}, w.header["Trailer"]...)
	w.header.Del("Trailer")
	w.header.Del("Content-Length")
	var buf bytes.Buffer
	_ = w.header.Write(&buf)
	_, _ = w.w.Write(frameHeader(metadataFlag, buf.Len()))
	_, _ = w.w.Write(buf.Bytes())
	w.headerWritten = true
}

func (w *wsResponseWriter) Flush() {}

func (w *wsResponseWriter) Close() error {
	defer w.w.Close()
	trailers := make(http.Header)
	if !w.headerWritten {
		// Trailers-only: everything goes in the one metadata frame.
		for k, vs := range w.header {
			if k != "Trailer" && !strings.HasPrefix(k, http.TrailerPrefix) {
				trailers[k] = vs
			}
		}
	} else {
		for _, k := range w.announced {
			k = http.CanonicalHeaderKey(k)
			if vs, ok := w.header[k]; ok {
				trailers[k] = vs
			}
		}
	}
	for k, vs := range w.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			name := http.CanonicalHeaderKey(strings.TrimPrefix(k, http.TrailerPrefix))
			trailers[name] = append(trailers[name], vs...)
		}
	}
	var buf bytes.Buffer
	if err := trailers.Write(&buf); err != nil {
		return err
	}
	if _, err := w.w.Write(frameHeader(metadataFlag, buf.Len())); err != nil {
		return err
	}
	_, err := w.w.Write(buf.Bytes())
	return err
}

// serveDowngrading serves grpcSrv on lis as upstream's principal does with --enable-websocket:
// an http.Server speaking HTTP/1.1, h2 and h2c, with TLS when tlsConfig is set.
func serveDowngrading(lis net.Listener, grpcSrv *grpc.Server, tlsConfig *tls.Config) *http.Server {
	srv := &http.Server{TLSConfig: tlsConfig, Handler: downgradingHandler(grpcSrv)}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetHTTP2(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() {
		if tlsConfig != nil {
			_ = srv.ServeTLS(lis, "", "")
		} else {
			_ = srv.Serve(lis)
		}
	}()
	return srv
}

// === client: the local HTTP/2 proxy that opens a WebSocket per call ===

type wsProxy struct {
	endpoint string
	scheme   string
	client   *http.Client
}

func (h *wsProxy) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.ProtoMajor != 2 || !strings.HasPrefix(req.Header.Get("Content-Type"), "application/grpc") {
		w.WriteHeader(http.StatusUnsupportedMediaType)
		return
	}
	u := url.URL{Scheme: h.scheme, Host: h.endpoint, Path: req.URL.Path, RawQuery: req.URL.RawQuery}
	conn, resp, err := websocket.Dial(req.Context(), u.String(), &websocket.DialOptions{
		HTTPHeader:      req.Header,
		HTTPClient:      h.client,
		Subprotocols:    []string{wsSubprotocol},
		CompressionMode: websocket.CompressionDisabled,
	})
	if resp != nil && resp.Body != nil {
		defer resp.Body.Close()
	}
	if err != nil {
		writeTransportError(w, fmt.Errorf("connecting to gRPC endpoint %q: %w", u.String(), err))
		return
	}
	conn.SetReadLimit(wsReadLimit)
	var wg sync.WaitGroup
	var writeErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := wsWrite(req.Context(), conn, req.Body); err != nil {
			writeErr = err
			_ = conn.Close(websocket.StatusInternalError, err.Error())
			return
		}
		if err := conn.Write(req.Context(), websocket.MessageBinary, endOfStream); err != nil {
			writeErr = err
		}
	}()
	readErr := readFromServer(req.Context(), conn, w)
	_ = req.Body.Close()
	wg.Wait()
	if err := errors.Join(readErr, writeErr); err != nil && len(w.Header()["Grpc-Status"]) == 0 {
		writeTransportError(w, err)
	}
	_ = conn.Close(websocket.StatusNormalClosure, "")
}

func readFromServer(ctx context.Context, conn *websocket.Conn, w http.ResponseWriter) error {
	defer conn.CloseRead(ctx)
	typ, msg, err := conn.Read(ctx)
	if err != nil {
		return err
	}
	if typ != websocket.MessageBinary {
		return fmt.Errorf("expected a binary message, got %v", typ)
	}
	if err := validateFrame(msg); err != nil {
		return err
	}
	if msg[0]&metadataFlag == 0 {
		return errors.New("did not receive the response headers first")
	}
	if err := setHeader(w, msg[frameHeaderLen:], false); err != nil {
		return err
	}
	if len(w.Header()["Grpc-Status"]) > 0 {
		return nil // trailers-only
	}
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			return fmt.Errorf("reading the response: %w", err)
		}
		if typ != websocket.MessageBinary {
			return fmt.Errorf("expected a binary message, got %v", typ)
		}
		if err := validateFrame(msg); err != nil {
			return err
		}
		if msg[0]&metadataFlag == 0 {
			if _, err := w.Write(msg); err != nil {
				return err
			}
			if flusher != nil {
				flusher.Flush()
			}
			continue
		}
		if msg[0]&compressedFlag != 0 {
			return errors.New("compressed metadata")
		}
		if err := setHeader(w, msg[frameHeaderLen:], true); err != nil {
			return err
		}
		// After the trailers only the close may come.
		_, _, err = conn.Read(ctx)
		switch websocket.CloseStatus(err) {
		case websocket.StatusNormalClosure, websocket.StatusGoingAway:
			return nil
		}
		if err == io.EOF {
			return nil
		}
		if err == nil {
			return errors.New("message after the trailers")
		}
		return err
	}
}

func setHeader(w http.ResponseWriter, block []byte, trailers bool) error {
	hdr, err := textproto.NewReader(bufio.NewReader(io.MultiReader(bytes.NewReader(block), strings.NewReader("\r\n")))).ReadMIMEHeader()
	if err != nil {
		return err
	}
	for k, vs := range hdr {
		if trailers {
			k = http.TrailerPrefix + k
		}
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	return nil
}

func writeTransportError(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "application/grpc")
	w.WriteHeader(http.StatusOK)
	w.Header().Set(http.TrailerPrefix+"Grpc-Status", fmt.Sprint(int(codes.Unavailable)))
	w.Header().Set(http.TrailerPrefix+"Grpc-Message", url.PathEscape("transport: "+err.Error()))
}

// connectViaWSProxy is the agent's side: a gRPC client connection to a local h2c proxy that
// carries every call to endpoint as a WebSocket (TLS with tlsConfig, plaintext when nil).
func connectViaWSProxy(endpoint string, tlsConfig *tls.Config, opts ...grpc.DialOption) (*grpc.ClientConn, func(), error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	proxy := &wsProxy{endpoint: endpoint, scheme: "http", client: &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}}
	if tlsConfig != nil {
		proxy.scheme = "https"
	}
	srv := &http.Server{Handler: h2c.NewHandler(proxy, &http2.Server{})}
	go func() { _ = srv.Serve(lis) }()
	opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn, err := grpc.NewClient(lis.Addr().String(), opts...)
	if err != nil {
		_ = srv.Close()
		return nil, nil, err
	}
	return conn, func() { _ = conn.Close(); _ = srv.Close() }, nil
}
