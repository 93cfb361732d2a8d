package main

import (
	"encoding/hex"
	"fmt"

	format "github.com/cloudevents/sdk-go/binding/format/protobuf/v2"
	"google.golang.org/protobuf/proto"

	"argocd-agent-rs/tests/gopeer/internal/pb/eventstreamapi"
)

// runCodec decodes and encodes single stream messages (eventstreamapi.Event, base64) without a
// connection: the whole catalogue, including events our processes never emit, crosses here.
func runCodec(args []string) error {
	if len(args) != 0 {
		return fmt.Errorf("codec takes no flags")
	}
	out.report(map[string]any{"kind": "ready"})
	commands(func(c command) error {
		switch c.Cmd {
		case "decode":
			b, err := hex.DecodeString(c.Wire)
			if err != nil {
				return fmt.Errorf("wire is not hex: %w", err)
			}
			var msg eventstreamapi.Event
			if err := proto.Unmarshal(b, &msg); err != nil {
				return fmt.Errorf("not an eventstreamapi.Event: %w", err)
			}
			rep, _, _ := received(msg.GetEvent())
			rep["cmd_id"] = c.ID
			out.report(rep)
		case "encode":
			ev, err := buildEvent(c.Source, c)
			if err != nil {
				return err
			}
			pev, err := format.ToProto(ev)
			if err != nil {
				return err
			}
			b, err := proto.Marshal(&eventstreamapi.Event{Event: pev})
			if err != nil {
				return err
			}
			out.report(map[string]any{"kind": "encoded", "cmd_id": c.ID, "wire": hex.EncodeToString(b)})
		default:
			return fmt.Errorf("unknown command %q", c.Cmd)
		}
		return nil
	})
	return nil
}
