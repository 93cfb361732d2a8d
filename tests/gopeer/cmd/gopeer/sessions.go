package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"argocd-agent-rs/tests/gopeer/internal/pb/logstreamapi"
	"argocd-agent-rs/tests/gopeer/internal/pb/terminalstreamapi"
)

// sessions answers the principal's side-stream requests the way upstream's agent does
// (agent/log.go, agent/terminal.go): on the same connection, a StreamLogs or StreamTerminal
// call carrying the stream's access token, opened with a handshake frame holding only the
// request UUID. The "pod" is simulated: logs are numbered lines, a terminal echoes its stdin.
type sessions struct {
	ctx   context.Context
	conn  *grpc.ClientConn
	token string
	lines int // log lines each log request is answered with
}

// onEvent starts the answer to a side-stream request; other events are left alone.
func (s *sessions) onEvent(ev *cloudevents.Event, target string) {
	switch {
	case target == targetContainerLog && isHTTPMethod(ev.Type()):
		var req containerLogRequest
		if err := json.Unmarshal(ev.Data(), &req); err != nil {
			out.report(map[string]any{"kind": "log_request_error", "error": err.Error()})
			return
		}
		go s.answerLogs(req)
	case target == targetTerminal && ev.Type() == typeTerminalReq:
		var req containerTerminalRequest
		if err := json.Unmarshal(ev.Data(), &req); err != nil {
			out.report(map[string]any{"kind": "terminal_request_error", "error": err.Error()})
			return
		}
		go s.answerTerminal(req)
	}
}

func (s *sessions) callContext() context.Context {
	return metadata.AppendToOutgoingContext(s.ctx, "authorization", s.token)
}

// answerLogs streams s.lines numbered lines, each with a kubelet timestamp as upstream's agent
// always asks Kubernetes for them, then EOF (follow or not: this pod's log is complete).
func (s *sessions) answerLogs(req containerLogRequest) {
	stream, err := logstreamapi.NewLogStreamServiceClient(s.conn).StreamLogs(s.callContext())
	if err != nil {
		out.report(map[string]any{"kind": "log_stream_error", "uuid": req.UUID, "error": err.Error()})
		return
	}
	send := func(d *logstreamapi.LogStreamData) error { d.RequestUuid = req.UUID; return stream.Send(d) }
	err = send(&logstreamapi.LogStreamData{})
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := 1; err == nil && i <= s.lines; i++ {
		ts := base.Add(time.Duration(i) * time.Millisecond).Format(time.RFC3339Nano)
		line := fmt.Sprintf("%s %s/%s line %d\n", ts, req.Namespace, req.PodName, i)
		err = send(&logstreamapi.LogStreamData{Data: []byte(line)})
	}
	if err == nil {
		err = send(&logstreamapi.LogStreamData{Eof: true})
	}
	resp, cerr := stream.CloseAndRecv()
	rep := map[string]any{"kind": "log_stream_done", "uuid": req.UUID, "pod": req.PodName, "follow": req.Follow}
	if err == nil {
		err = cerr
	}
	if err != nil {
		st, _ := status.FromError(err)
		rep["code"] = st.Code().String()
		rep["message"] = st.Message()
	} else {
		rep["status"] = resp.GetStatus()
		rep["response_uuid"] = resp.GetRequestUuid()
	}
	out.report(rep)
}

// answerTerminal runs an echoing "shell": stdin comes back on stdout, resizes are reported,
// and the principal's EOF ends the session with this side's EOF.
func (s *sessions) answerTerminal(req containerTerminalRequest) {
	ctx, cancel := context.WithCancel(s.callContext())
	defer cancel()
	stream, err := terminalstreamapi.NewTerminalStreamServiceClient(s.conn).StreamTerminal(ctx)
	if err != nil {
		out.report(map[string]any{"kind": "terminal_error", "uuid": req.UUID, "error": err.Error()})
		return
	}
	if err := stream.Send(&terminalstreamapi.TerminalStreamData{RequestUuid: req.UUID}); err != nil {
		out.report(map[string]any{"kind": "terminal_error", "uuid": req.UUID, "error": err.Error()})
		return
	}
	out.report(map[string]any{"kind": "terminal_open", "uuid": req.UUID, "pod": req.PodName, "command": req.Command, "tty": req.TTY})
	rep := map[string]any{"kind": "terminal_done", "uuid": req.UUID}
	for {
		msg, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				st, _ := status.FromError(err)
				rep["code"] = st.Code().String()
				rep["message"] = st.Message()
			}
			break
		}
		switch {
		case msg.GetResize():
			out.report(map[string]any{"kind": "terminal_resize", "uuid": req.UUID, "rows": msg.GetRows(), "cols": msg.GetCols()})
		case msg.GetEof():
			err = stream.Send(&terminalstreamapi.TerminalStreamData{RequestUuid: req.UUID, Eof: true})
		case len(msg.GetData()) > 0:
			err = stream.Send(&terminalstreamapi.TerminalStreamData{RequestUuid: req.UUID, StreamType: "stdout", Data: msg.GetData()})
		}
		if err != nil {
			rep["send_error"] = err.Error()
			break
		}
		if msg.GetEof() {
			_ = stream.CloseSend()
		}
	}
	out.report(rep)
}
