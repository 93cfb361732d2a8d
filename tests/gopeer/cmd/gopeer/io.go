package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"sync"
)

// reporter writes one JSON object per line to stdout; safe for concurrent use.
type reporter struct {
	mu  sync.Mutex
	out io.Writer
}

var out = &reporter{out: os.Stdout}

func (r *reporter) report(v map[string]any) {
	b, err := json.Marshal(v)
	if err != nil {
		log.Printf("cannot encode report: %v", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintln(r.out, string(b))
}

// command is one line on stdin.
type command struct {
	Cmd string `json:"cmd"`
	// send: the event to build as upstream's constructors do.
	Type       string          `json:"type"`
	Target     string          `json:"target"`
	Data       json.RawMessage `json:"data"`
	ResourceID string          `json:"resourceid"`
	EventID    string          `json:"eventid"`
	// checksum_keys: the resource-set checksum of these keys goes into the payload's checksum
	// (request-synced-resource-list); spec_checksum_of: the spec checksum of this object goes
	// into it (request-update). Both computed here, with Go's encoding/json.
	ChecksumKeys   []resourceKey   `json:"checksum_keys"`
	SpecChecksumOf json.RawMessage `json:"spec_checksum_of"`
	// decode: hex of an eventstreamapi.Event.
	Wire string `json:"wire"`
	// checksum: resource keys; spec_checksum: an object.
	Keys   []resourceKey   `json:"keys"`
	Object json.RawMessage `json:"object"`
	// source: the CloudEvent source of a sent event (upstream: "" from the principal).
	Source string `json:"source"`
	// id: echoed as cmd_id in the answer so the test can match it.
	ID string `json:"id"`
}

// commands reads stdin until EOF or "quit" and hands each command to handle; an error from
// handle is reported, not fatal.
func commands(handle func(c command) error) {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var c command
		if err := json.Unmarshal(line, &c); err != nil {
			out.report(map[string]any{"kind": "command_error", "error": fmt.Sprintf("bad command: %v", err)})
			continue
		}
		if c.Cmd == "quit" {
			return
		}
		if err := handleCommon(c, handle); err != nil {
			out.report(map[string]any{"kind": "command_error", "cmd_id": c.ID, "cmd": c.Cmd, "error": err.Error()})
		}
	}
}

// handleCommon answers the commands every role knows (checksums), and passes the rest on.
func handleCommon(c command, handle func(c command) error) error {
	switch c.Cmd {
	case "checksum":
		sum := resourceSetChecksum(c.Keys)
		out.report(map[string]any{"kind": "checksum", "cmd_id": c.ID, "checksum": hexOrNil(sum)})
		return nil
	case "spec_checksum":
		sum, err := specChecksum(c.Object)
		if err != nil {
			return err
		}
		out.report(map[string]any{"kind": "spec_checksum", "cmd_id": c.ID, "checksum": hexOrNil(sum)})
		return nil
	}
	return handle(c)
}
