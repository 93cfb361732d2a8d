package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"argocd-agent-rs/tests/gopeer/internal/pb"
)

// runCheckProtos fails unless every .proto in dir has the hash the generated Go code was made
// from, and no .proto was added or removed since: the committed .pb.go files are then current.
func runCheckProtos(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: check-protos PROTO_DIR")
	}
	files, err := filepath.Glob(filepath.Join(args[0], "*.proto"))
	if err != nil {
		return err
	}
	var problems []string
	seen := map[string]bool{}
	for _, f := range files {
		name := filepath.Base(f)
		seen[name] = true
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		want, ok := pb.ProtoSHA256[name]
		switch {
		case !ok:
			problems = append(problems, name+" is new")
		case want != hex.EncodeToString(sum[:]):
			problems = append(problems, name+" changed")
		}
	}
	for name := range pb.ProtoSHA256 {
		if !seen[name] {
			problems = append(problems, name+" was removed")
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fmt.Errorf("the Go peer's generated code is stale (%s): run tests/gopeer/generate.sh", strings.Join(problems, ", "))
	}
	fmt.Printf("{\"kind\":\"protos_current\",\"files\":%d}\n", len(files))
	return nil
}
