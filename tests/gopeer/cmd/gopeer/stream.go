package main

import (
	"context"
	"errors"
	"io"
	"sync"

	format "github.com/cloudevents/sdk-go/binding/format/protobuf/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"google.golang.org/grpc/status"

	"argocd-agent-rs/tests/gopeer/internal/pb/eventstreamapi"
)

// eventStream is either end of Subscribe.
type eventStream interface {
	Send(*eventstreamapi.Event) error
	Recv() (*eventstreamapi.Event, error)
}

// peer runs one Subscribe stream: it reports every event received and ACKs it as upstream
// does, and sends what the test asks for.
type peer struct {
	role   string // "agent" or "principal"
	source string // CloudEvent source of what this peer sends
	mu     sync.Mutex
	stream eventStream
	// onEvent, when set, sees every event received (after it is reported, before its ACK).
	onEvent func(ev *cloudevents.Event, target string)
}

// send encodes with sdk-go's ToProto and sends; Send is not safe for concurrent use.
func (p *peer) send(ev *cloudevents.Event) error {
	pev, err := format.ToProto(ev)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stream == nil {
		return errors.New("no stream yet")
	}
	return p.stream.Send(&eventstreamapi.Event{Event: pev})
}

// receive reports events until the stream ends; it returns the end as a report.
func (p *peer) receive(ctx context.Context, s eventStream) {
	for {
		msg, err := s.Recv()
		if err != nil {
			rep := map[string]any{"kind": "stream_end"}
			if !errors.Is(err, io.EOF) {
				st, _ := status.FromError(err)
				rep["code"] = st.Code().String()
				rep["message"] = st.Message()
			}
			out.report(rep)
			return
		}
		if ctx.Err() != nil {
			return
		}
		rep, ev, target := received(msg.GetEvent())
		out.report(rep)
		if p.onEvent != nil && ev != nil {
			p.onEvent(ev, target)
		}
		// Upstream drops an event with an unknown target without an ACK (the agent logs "unknown
		// event target"; the principal's FromWire fails), and never ACKs an ACK.
		if ev == nil || target == "" || target == targetEventAck {
			continue
		}
		// The agent never gets heartbeats; the principal ACKs them like everything else.
		if err := p.send(processedEvent(p.source, ev)); err != nil {
			out.report(map[string]any{"kind": "send_error", "error": err.Error()})
		} else {
			out.report(map[string]any{"kind": "acked", "resourceid": extString(ev, extResourceID), "eventid": extString(ev, extEventID), "type": ev.Type()})
		}
	}
}

// handleSend is the "send" command of both roles.
func (p *peer) handleSend(c command) error {
	if c.Cmd != "send" {
		return errors.New("unknown command " + c.Cmd)
	}
	if c.Source == "" {
		c.Source = p.source
	}
	ev, err := buildEvent(c.Source, c)
	if err != nil {
		return err
	}
	if err := p.send(ev); err != nil {
		return err
	}
	out.report(map[string]any{"kind": "sent", "cmd_id": c.ID, "type": ev.Type(), "resourceid": extString(ev, extResourceID), "eventid": extString(ev, extEventID)})
	return nil
}
